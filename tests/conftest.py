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

import pytest

_VENV_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _VENV_BIN:
    os.environ["PATH"] = os.pathsep.join([_VENV_BIN, os.environ.get("PATH", "")])
os.environ.setdefault("RELAYGR_PROFILE_DISTURBED_RATIO", "1e9")


# ---- in-process servers that answered UNKNOWN or INTERNAL ----
# A server that answers UNKNOWN or INTERNAL hit an unhandled error (`services.common.interceptor`). Servers
# a test runs in this process count into the process's registry; the tests during which the count grew
# are listed at the end of the run, with the series, so that an error no test asserts on is seen. Tests
# that make a server answer so on purpose (a proxy passing a downstream INTERNAL on) are listed too.
_UNHANDLED: list[str] = []


def _unhandled_counts() -> dict[tuple[tuple[str, str], ...], float]:
    from prometheus_client import REGISTRY

    codes = ("UNKNOWN", "INTERNAL")
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "grpc_server_handled_total" and sample.labels.get("grpc_code") in codes
    }


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _unhandled_counts()
    yield
    grew = {series: n - before.get(series, 0.0) for series, n in _unhandled_counts().items()}
    for series, n in grew.items():
        if n:
            labels = dict(series)
            call = f"{labels['grpc_service']}/{labels['grpc_method']}"
            _UNHANDLED.append(f"{item.nodeid}: {call} {labels['grpc_code']} x{n:g}")


def pytest_terminal_summary(terminalreporter):
    if _UNHANDLED:
        terminalreporter.section("in-process servers that answered UNKNOWN or INTERNAL")
        for line in _UNHANDLED:
            terminalreporter.write_line(line)
