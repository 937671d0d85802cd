"""Prefix KV on the wire between rankers (`services.ranker.handoff`): an entry's layout, its bytes, and
the chunks they travel in.

An entry travels as its `HandoffEntry` (key, events, layout, size, CRC-32) on its first chunk and its KV
bytes in chunks of at most `CHUNK_BYTES`, the last one marked `last`. The bytes are the buffer of a
`PrefixKV` with one user, `[layers, 2, 1, heads, rows, head_dim]` (rows: the events times the layout's
tokens an event), little-endian, C order, in the
sender's DRAM dtype: what the receiver's DRAM tier would hold after a demotion, so admitting it copies the
bytes once, into their place.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Iterator

import numpy as np
import torch

from relaygr.v1 import common_pb2, handoff_pb2
from services.ranker.model.events import Events

CHUNK_BYTES = 1 << 20

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

if sys.byteorder != "little":  # the wire's byte order is the host's: refuse to run where they differ
    raise ImportError("the cache handoff's wire format is little-endian; this host is not")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def layout(
    layers: int, heads: int, head_dim: int, dtype: torch.dtype, tokens_per_event: int
) -> handoff_pb2.KvLayout:
    return handoff_pb2.KvLayout(
        dtype=dtype_name(dtype),
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        tokens_per_event=tokens_per_event,
    )


def shape(kv_layout: handoff_pb2.KvLayout, nbytes: int, events: int) -> tuple[int, ...] | None:
    """The buffer shape of `nbytes` of `events` in `kv_layout`; None when the layout is unknown or the bytes
    are not exactly `events` times the layout's tokens an event."""
    dtype = DTYPES.get(kv_layout.dtype)
    sizes = (kv_layout.layers, kv_layout.heads, kv_layout.head_dim, kv_layout.tokens_per_event)
    if dtype is None or min(sizes) <= 0 or events <= 0:
        return None
    rows = events * kv_layout.tokens_per_event
    if nbytes != rows * kv_layout.layers * 2 * kv_layout.heads * kv_layout.head_dim * dtype.itemsize:
        return None
    return (kv_layout.layers, 2, 1, kv_layout.heads, rows, kv_layout.head_dim)


def as_bytes(buffer: torch.Tensor) -> memoryview:
    """A host buffer's bytes, without a copy when it is contiguous."""
    return memoryview(buffer.contiguous().reshape(-1).view(torch.uint8).numpy())


def crc32(data: memoryview) -> int:
    return zlib.crc32(data)


def sequence(events: Events) -> common_pb2.BehaviorSequence:
    return common_pb2.BehaviorSequence(
        item_ids=events.item_ids.tolist(),
        action_types=events.action_types.tolist(),
        timestamps_ms=events.timestamps_ms.tolist(),
    )


def chunks(entry: handoff_pb2.HandoffEntry, data: memoryview) -> Iterator[handoff_pb2.HandoffChunk]:
    """`entry`'s chunks: the header with the first piece of `data`, then a piece each, the last marked."""
    total = len(data)
    for start in range(0, max(total, 1), CHUNK_BYTES):
        end = min(start + CHUNK_BYTES, total)
        yield handoff_pb2.HandoffChunk(
            entry=entry if start == 0 else None, data=bytes(data[start:end]), last=end >= total
        )


class Assembly:
    """The bytes of one incoming entry written into `destination` (a host buffer of the entry's size), with
    their running CRC-32: `complete` once exactly `nbytes` arrived with the header's checksum."""

    def __init__(self, entry: handoff_pb2.HandoffEntry, destination: torch.Tensor) -> None:
        self.entry = entry
        self._view = destination.reshape(-1).view(torch.uint8).numpy()
        self.received = 0
        self.overflow = False
        self._crc = 0

    def write(self, data: bytes) -> None:
        end = self.received + len(data)
        if end > len(self._view):
            self.overflow = True
        else:
            self._view[self.received : end] = np.frombuffer(data, dtype=np.uint8)
            self._crc = zlib.crc32(data, self._crc)
        self.received = end

    @property
    def complete(self) -> bool:
        return not self.overflow and self.received == self.entry.nbytes and self._crc == self.entry.crc32
