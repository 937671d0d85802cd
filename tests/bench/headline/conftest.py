"""The `fast` fixture of the block experiment's tests: no settling pauses, the fake canary, no steal, and
results under the test's own folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.headline import __main__ as headline_main
from bench.headline import config as headline_config
from tests.bench.headline.fakes import FakeBench, FakeCanary


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No settling pauses, the fake canary, no steal (the host's real steal would move every slowdown), and
    results under `tmp_path`."""
    monkeypatch.setattr(headline_main, "cpu_times", lambda: (0, 0))
    monkeypatch.setattr(headline_main, "SETTLE_S", 0.0)
    monkeypatch.setattr(headline_config, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(headline_main, "Canary", lambda *args: FakeCanary(FakeBench.made[-1]))
    return tmp_path
