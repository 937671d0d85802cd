"""The accelerator's API on CPU (the stand-ins every caller's logic runs on without a device), and the
in-flight window that bounds how much pre-inference is queued ahead of a Rank."""

from __future__ import annotations

import pytest
import torch

from services.ranker.device.accelerator import Accelerator, CpuEvent, CpuStream, InflightWindow
from tests.ranker.harness import PendingEvent


def test_the_cpu_accelerator_is_synchronous_and_copies_only_when_forced():
    cpu = Accelerator(torch.device("cpu"))
    assert not cpu.asynchronous and not cpu.copies
    assert Accelerator(torch.device("cpu"), copies=True).copies
    streams = (cpu.rank_stream, cpu.pre_infer_stream, cpu.copy_stream)
    assert all(isinstance(stream, CpuStream) for stream in streams)
    assert len({id(stream) for stream in streams}) == 3
    # Lower numbers run first (CUDA, Ascend): Ranks outrank pre-inference.
    assert cpu.rank_stream.priority < cpu.pre_infer_stream.priority


def test_cpu_events_are_complete_once_recorded():
    cpu = Accelerator(torch.device("cpu"))
    with cpu.on(cpu.pre_infer_stream):
        event = cpu.record()
    assert isinstance(event, CpuEvent) and event.query()
    event.wait()
    event.wait(cpu.rank_stream)
    event.synchronize()
    assert cpu.record(cpu.copy_stream).query()
    tensor = torch.ones(3)
    cpu.used_by(tensor, cpu.rank_stream)  # nothing for an allocator to know on CPU
    assert torch.equal(tensor, torch.ones(3))


def test_pinned_on_cpu():
    cpu = Accelerator(torch.device("cpu"))
    buffer = cpu.pinned(4096)
    assert buffer.dtype == torch.uint8 and buffer.shape == (4096,) and buffer.device.type == "cpu"


def test_the_window_never_holds_more_than_its_limit_and_waits_for_the_oldest():
    window = InflightWindow(2)
    events = [PendingEvent() for _ in range(6)]
    for count, event in enumerate(events, start=1):
        window.push(event)
        assert window.outstanding == min(count, 2)
    # The host waited for exactly the oldest events, each once, the two newest still queued.
    assert [event.waited for event in events] == [1, 1, 1, 1, 0, 0]
    window.drain()
    assert window.outstanding == 0 and all(event.waited == 1 for event in events)


def test_the_window_forgets_completed_events_without_waiting():
    window = InflightWindow(1)
    first, second = PendingEvent(), PendingEvent()
    window.push(first)
    first.done = True  # the device finished it on its own
    window.push(second)
    assert first.waited == 0 and window.outstanding == 1
    with pytest.raises(ValueError, match="at least 1"):
        InflightWindow(0)
