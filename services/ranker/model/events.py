"""Behaviour sequences as validated, immutable int64 arrays, with the fingerprint a cache key uses."""

from __future__ import annotations

import dataclasses
import hashlib
from functools import cached_property

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Events:
    """Parallel arrays of one user's events, oldest first. Timestamps may be empty (unknown).

    `wire_digest` is the digest of the BehaviorSequence bytes they were decoded from (`services.ranker.wire`),
    empty for events made in process: the same bytes seen again are these events, without a decode."""

    item_ids: np.ndarray
    action_types: np.ndarray
    timestamps_ms: np.ndarray
    wire_digest: bytes = b""

    @classmethod
    def of(cls, item_ids, action_types, timestamps_ms=()) -> Events:
        return cls(
            np.asarray(item_ids, dtype=np.int64),
            np.asarray(action_types, dtype=np.int64),
            np.asarray(timestamps_ms, dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.item_ids)

    @cached_property
    def fingerprint(self) -> str:
        """Digest of every event field: two sequences share it only if they are identical."""
        digest = hashlib.sha256()  # hardware-accelerated on x86 and Arm: the fastest stdlib digest here
        for array in (self.item_ids, self.action_types, self.timestamps_ms):
            digest.update(len(array).to_bytes(8, "little"))
            digest.update(np.ascontiguousarray(array).data)
        return digest.hexdigest()[:32]

    def has_prefix(self, other: Events) -> bool:
        """True when `other` is a strict prefix of these events (the user acted since)."""
        n = len(other)
        if not 0 < n < len(self):
            return False
        if len(other.timestamps_ms) != (n if len(self.timestamps_ms) else 0):
            return False
        return bool(
            np.array_equal(self.item_ids[:n], other.item_ids)
            and np.array_equal(self.action_types[:n], other.action_types)
            and np.array_equal(self.timestamps_ms[:n], other.timestamps_ms)
        )

    def suffix(self, start: int) -> Events:
        return Events(
            self.item_ids[start:],
            self.action_types[start:],
            self.timestamps_ms[start:] if len(self.timestamps_ms) else self.timestamps_ms,
        )
