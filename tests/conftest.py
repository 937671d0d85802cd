"""Suite-wide set-up: the tools pinned into the virtualenv come first on PATH.

`make install` puts a pinned kubectl (with kustomize) into the venv's bin; tests find tools with
`shutil.which`, so the venv's copy must win over whatever the machine has, also when pytest is run
directly as `.venv/bin/python -m pytest` rather than through `make test`.

Every ranker a test starts judges its warm-up undisturbed (`RELAYGR_PROFILE_DISTURBED_RATIO`, inherited by
the fleets' processes): rankers started together on a busy 2-core machine would otherwise serve a
provisional curve, which the trigger reads as unknown and relays only long histories by, and tests that
relay short histories would measure the machine. tests/trigger/test_fleet_start.py, the test of that
behaviour, removes it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_VENV_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _VENV_BIN:
    os.environ["PATH"] = os.pathsep.join([_VENV_BIN, os.environ.get("PATH", "")])
os.environ.setdefault("RELAYGR_PROFILE_DISTURBED_RATIO", "1e9")
