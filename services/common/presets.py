"""The names of the ranker's model presets: what its `--model-preset` takes, and what every command that
starts rankers (the launcher, bench/) passes on and may refuse before it starts a fleet.

Only the vocabulary lives here. The presets themselves (shapes, dtypes, tier sizes; they need torch) are
the ranker's, built under these names in `services/ranker/model/presets.py`, which the ranker's tests hold
equal to this list; a command that starts rankers imports no module of the ranker.
"""

from __future__ import annotations

MODEL_PRESET_NAMES = ("cpu-tiny", "cpu-small", "gpu-dlrmv3")
