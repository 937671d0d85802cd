"""Validation of client input shared by every service. Each failure names the offending field."""

from __future__ import annotations

from relaygr.v1 import common_pb2
from services.common.errors import InvalidArgument

MAX_USER_ID_BYTES = 256
INT64_MAX = 2**63 - 1


def user_id(value: str, field: str = "user_id") -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_USER_ID_BYTES:
        raise InvalidArgument(field, f"is longer than {MAX_USER_ID_BYTES} bytes")
    return value


def behavior_sequence(
    seq: common_pb2.BehaviorSequence,
    field: str,
    max_events: int,
    num_action_types: int,
    allow_empty: bool,
) -> int:
    """Checks a BehaviorSequence and returns its length."""
    n = len(seq.item_ids)
    if len(seq.action_types) != n:
        raise InvalidArgument(
            f"{field}.action_types", f"has {len(seq.action_types)} entries but item_ids has {n}"
        )
    if len(seq.timestamps_ms) not in (0, n):
        raise InvalidArgument(
            f"{field}.timestamps_ms", f"has {len(seq.timestamps_ms)} entries but item_ids has {n}"
        )
    if n == 0 and not allow_empty:
        raise InvalidArgument(f"{field}.item_ids", "must not be empty")
    if n > max_events:
        raise InvalidArgument(f"{field}.item_ids", f"has {n} events, more than the limit of {max_events}")
    if n and min(seq.item_ids) < 0:
        raise InvalidArgument(f"{field}.item_ids", "must be non-negative")
    if n and (min(seq.action_types) < 0 or max(seq.action_types) >= num_action_types):
        raise InvalidArgument(f"{field}.action_types", f"must be in [0, {num_action_types})")
    if len(seq.timestamps_ms) and min(seq.timestamps_ms) < 0:
        raise InvalidArgument(f"{field}.timestamps_ms", "must be non-negative")
    return n


def candidates(item_ids, max_candidates: int, field: str = "candidate_item_ids") -> int:
    n = len(item_ids)
    if n == 0:
        raise InvalidArgument(field, "must not be empty")
    if n > max_candidates:
        raise InvalidArgument(field, f"has {n} candidates, more than the limit of {max_candidates}")
    if min(item_ids) < 0:
        raise InvalidArgument(field, "must be non-negative")
    return n


def positive(value: int, field: str, limit: int) -> int:
    if value <= 0:
        raise InvalidArgument(field, "must be positive")
    if value > limit:
        raise InvalidArgument(field, f"is {value}, more than the limit of {limit}")
    return value
