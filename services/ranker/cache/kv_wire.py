"""Prefix KV on the wire between rankers (`services.ranker.handoff`): an entry's layout, its bytes, and
the chunks they travel in.

An entry travels as its `HandoffEntry` (key, events, layout, size, CRC-32, and in FP8 its scales) on its
first chunk and its KV bytes in chunks of at most `CHUNK_BYTES`, the last one marked `last`. The bytes are
the buffer of a `PrefixKV` with one user, `[layers, 2, 1, heads, rows, head_dim]` (rows: the events times
the layout's tokens an event), little-endian, C order, in the sender's DRAM dtype: what the receiver's DRAM
tier would hold after a demotion, so admitting it copies the bytes once, into their place. An FP8 entry's
scales (`scale`: float32 `[layers, 2, 1, heads]`, little-endian) ride in its header; the CRC-32 covers the
KV bytes, then the scales.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Iterator

import numpy as np
import torch

from relaygr.v1 import common_pb2, handoff_pb2
from services.ranker.model import kv_precision
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV

CHUNK_BYTES = 1 << 20

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
}

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


def scale_bytes(kv: PrefixKV) -> bytes:
    """The `scale` field of a host entry: its scales' bytes (none but in FP8)."""
    return b"" if kv.scale is None else bytes(as_bytes(kv.scale))


def scales(kv_layout: handoff_pb2.KvLayout, data: bytes) -> torch.Tensor | None:
    """The scales an entry in `kv_layout` carries, `[layers, 2, 1, heads, 1, 1]` float32, read from its
    `scale` field; None for a dtype without scales. ValueError when `data` is not one finite, positive
    float32 a layer, keys or values and head (or not empty, for a dtype without scales)."""
    if DTYPES.get(kv_layout.dtype) not in kv_precision.SCALED:
        if data:
            raise ValueError(f"{len(data)} bytes for a {kv_layout.dtype} entry, which has no scales")
        return None
    shape = (kv_layout.layers, 2, 1, kv_layout.heads, 1, 1)
    expected = math.prod(shape) * kv_precision.SCALE_DTYPE.itemsize
    if len(data) != expected:
        raise ValueError(
            f"{len(data)} bytes, not {expected}: one float32 a layer, keys or values and head "
            f"({kv_layout.layers} x 2 x {kv_layout.heads})"
        )
    scale = torch.frombuffer(bytearray(data), dtype=kv_precision.SCALE_DTYPE).reshape(shape)
    if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
        raise ValueError("every scale must be finite and positive")
    return scale


def crc32(data: memoryview, scale: bytes = b"") -> int:
    """The CRC-32 of an entry: its KV bytes, then its scales' bytes."""
    return zlib.crc32(scale, zlib.crc32(data))


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
    their running CRC-32: `complete` once exactly `nbytes` arrived with the header's checksum (over those
    bytes and the header's scales)."""

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
        if self.overflow or self.received != self.entry.nbytes:
            return False
        return zlib.crc32(self.entry.scale, self._crc) == self.entry.crc32
