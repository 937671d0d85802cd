"""Device selection and the accelerator's streams and events.

`--device auto` picks an Ascend NPU (torch_npu, imported only when installed), then CUDA, then CPU.
`Accelerator` gives the ranker its streams: Ranks on a high-priority stream, pre-inference on a
low-priority one, tier copies on a third, with hand-offs by events, so nothing on the serving path waits
for the whole device. CUDA and Ascend share the design through their backend modules (`torch.cuda`,
`torch.npu`: the same `Stream`/`Event`/`stream()` API). On CPU the same API is backed by stand-ins whose
work is synchronous, so every caller's logic runs, and is tested, without an accelerator.
"""

from __future__ import annotations

import collections
import contextlib
import importlib

import torch


def _npu_available() -> bool:
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        return False
    return bool(getattr(torch, "npu", None) and torch.npu.is_available())


def select_device(spec: str) -> torch.device:
    """The torch device for `--device`: npu, cuda, cpu (optionally with an index), or auto."""
    if spec == "auto":
        if _npu_available():
            return torch.device("npu")
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    if spec.startswith("npu") and not _npu_available():
        raise ValueError("--device npu needs torch_npu and an Ascend NPU")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda needs a CUDA build of torch and a GPU")
    return torch.device(spec)


def backend(device: torch.device):
    return getattr(torch, device.type) if device.type in ("cuda", "npu") else None


def synchronize(device: torch.device) -> None:
    """Waits for all work on the whole device. For warm-up, measurements and tests only: on the serving
    path it would block every stream, so hand-offs there go through `Accelerator`'s events."""
    module = backend(device)
    if module is not None:
        module.synchronize(device)


class CpuEvent:
    """A CPU stand-in for `torch.cuda.Event`: CPU work is synchronous, so once recorded it is complete."""

    def record(self, stream: CpuStream | None = None) -> None:
        """Marks the point reached by `stream`'s work: on CPU, everything submitted so far is done."""

    def wait(self, stream: CpuStream | None = None) -> None:
        """Orders later work on `stream` after this event: on CPU that order already holds."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Blocks the host until the event completes: on CPU it already has."""


class CpuStream:
    """A CPU stand-in for `torch.cuda.Stream`: work runs when submitted, in submission order."""

    def __init__(self, priority: int = 0) -> None:
        self.priority = priority

    def wait_event(self, event: CpuEvent) -> None:
        event.wait(self)

    def wait_stream(self, stream: CpuStream) -> None:
        """Orders later work here after `stream`'s work so far: on CPU, done already."""

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        event = event or CpuEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Blocks until the stream's work is done: on CPU it is."""


class Accelerator:
    """The device's streams and the operations that hand work between them.

    `rank_stream` (highest priority) runs Ranks, `pre_infer_stream` (lowest) runs pre-inference, and
    `copy_stream` runs the copies between the tiers. `copies` says whether tier moves really copy
    through the pinned host pool: True on an accelerator; False on CPU, where HBM and DRAM are budgets
    over the same memory, unless forced (`copies=True`) so the whole copy path runs on CPU.
    """

    def __init__(self, device: torch.device, copies: bool | None = None) -> None:
        self.device = torch.device(device)
        self.module = backend(self.device)
        self.asynchronous = self.module is not None
        self.copies = self.asynchronous if copies is None else bool(copies)
        low, high = self._priority_range()
        self.rank_stream = self._stream(high)
        self.pre_infer_stream = self._stream(low)
        self.copy_stream = self._stream(0)

    def _priority_range(self) -> tuple[int, int]:
        """(lowest, highest) stream priority: the backend's own range where it has one. Lower numbers
        run first on CUDA and Ascend, so the highest priority is the smaller number."""
        priority_range = getattr(getattr(self.module, "Stream", None), "priority_range", None)
        if self.asynchronous and callable(priority_range):
            low, high = priority_range()
            return int(low), int(high)
        return 0, -1

    def _stream(self, priority: int):
        if self.module is None:
            return CpuStream(priority)
        return self.module.Stream(self.device, priority=priority)

    def on(self, stream):
        """A context in which `stream` is the current stream (work queued inside runs on it)."""
        return self.module.stream(stream) if self.module is not None else contextlib.nullcontext()

    def current_stream(self):
        return self.module.current_stream(self.device) if self.module is not None else CpuStream()

    def default_stream(self):
        """The device's default stream (where work runs that no stream context placed elsewhere)."""
        return self.module.default_stream(self.device) if self.module is not None else CpuStream()

    def event(self):
        """A new, unrecorded event."""
        return self.module.Event() if self.module is not None else CpuEvent()

    def record(self, stream=None):
        """An event recorded on `stream` (None: the current stream): it completes when the work queued
        there so far has."""
        event = self.event()
        event.record(stream if stream is not None else self.current_stream())
        return event

    def used_by(self, tensor: torch.Tensor, stream) -> None:
        """Tells the caching allocator that `tensor`, allocated on another stream, is used on `stream`, so
        its memory is not reused before the work queued there completes."""
        if self.module is not None:
            tensor.record_stream(stream)

    def pinned(self, nbytes: int) -> torch.Tensor:
        """`nbytes` of host memory as uint8: page-locked on an accelerator (so copies are asynchronous)."""
        return torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=self.asynchronous)


class InflightWindow:
    """At most `limit` events of queued device work outstanding: pushing one more makes the host wait
    for the oldest (that event only, never the whole device), so the device never holds a backlog of
    more than `limit` chunks ahead of a Rank."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"InflightWindow limit must be at least 1, got {limit}")
        self.limit = limit
        self._events: collections.deque = collections.deque()

    @property
    def outstanding(self) -> int:
        return len(self._events)

    def push(self, event) -> None:
        """Adds `event`, forgets the oldest ones that have completed, then, while more than `limit` are
        outstanding, waits for the oldest."""
        self._events.append(event)
        while self._events and self._events[0].query():
            self._events.popleft()
        while len(self._events) > self.limit:
            self._events.popleft().synchronize()

    def drain(self) -> None:
        """Waits for every outstanding event, oldest first."""
        while self._events:
            self._events.popleft().synchronize()
