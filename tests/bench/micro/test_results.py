"""The committed results of the micro-benchmarks read back and render as committed, with the renderers of
today: the device path's report.md, shared-device's and serving's summary.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.lib import envelope
from bench.micro import shared_device
from bench.micro.accelerator import device
from bench.micro.serving.summary import summary

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"


@pytest.mark.parametrize("name", ["gpu-accelerator", "accelerator-cpu-small"])  # the latter before graphs
def test_a_committed_device_path_renders_as_committed(name):
    results = envelope.read(RESULTS / name / "results.json", "accelerator")
    assert device.report(results) == (RESULTS / name / "report.md").read_text()


def test_the_committed_shared_device_run_renders_as_committed():
    record = envelope.read(RESULTS / "shared-device" / "results.json", "shared-device")
    config = shared_device.SharedDeviceConfig(**record["configuration"])
    points = [shared_device.Point(**point) for point in record["points"]]
    assert [dataclasses.asdict(point) for point in points] == record["points"]
    assert shared_device.summary(config, points) == (RESULTS / "shared-device" / "summary.md").read_text()


def test_the_committed_serving_sweep_renders_as_committed():
    rendered = summary(envelope.read(RESULTS / "serving" / "results.json", "serving"))
    assert rendered == (RESULTS / "serving" / "summary.md").read_text()
