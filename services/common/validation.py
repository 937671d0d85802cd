"""Validation of client input shared by every service. Each failure names the offending field."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from relaygr.v1 import common_pb2
from services.common.errors import InvalidArgument

MAX_USER_ID_BYTES = 256
MAX_REQUEST_ID_CHARS = 128
MAX_INSTANCE_CHARS = 253
INT64_MAX = 2**63 - 1
# Printable ASCII without spaces: what trace and request ids (UUIDs, W3C trace ids, ULIDs) are made of.
_REQUEST_ID = re.compile(r"[!-~]+")
# A member name as Kubernetes names pods and hosts are named: letters, digits, '.', '-', '_'.
_INSTANCE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def user_id(value: str, field: str = "user_id") -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_USER_ID_BYTES:
        raise InvalidArgument(field, f"is longer than {MAX_USER_ID_BYTES} bytes")
    return value


def request_id(value: str, field: str = "request_id") -> str:
    """Optional; when given, at most 128 printable ASCII characters without spaces."""
    if len(value) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(field, f"is longer than {MAX_REQUEST_ID_CHARS} characters")
    if value and not _REQUEST_ID.fullmatch(value):
        raise InvalidArgument(field, "must be printable ASCII without spaces")
    return value


def instance_name(value: str, field: str = "relay_instance") -> str:
    """Optional; when given, a ranker's member name: letters, digits, '.', '-' and '_', starting and ending
    with a letter or digit, at most 253 characters (a DNS name's length, as pod and host names are)."""
    if len(value) > MAX_INSTANCE_CHARS:
        raise InvalidArgument(field, f"is longer than {MAX_INSTANCE_CHARS} characters")
    if value and not _INSTANCE.fullmatch(value):
        raise InvalidArgument(
            field, "must be a member name: letters, digits, '.', '-', '_', starting and ending alphanumeric"
        )
    return value


def sequence_arrays(
    seq: common_pb2.BehaviorSequence,
    field: str,
    max_events: int,
    num_action_types: int,
    allow_empty: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checks a BehaviorSequence and returns its (item_ids, action_types, timestamps_ms) as int64 arrays."""
    return event_arrays(
        seq.item_ids, seq.action_types, seq.timestamps_ms, field, max_events, num_action_types, allow_empty
    )


def event_arrays(
    item_ids: Sequence[int],
    action_types: Sequence[int],
    timestamps_ms: Sequence[int],
    field: str,
    max_events: int,
    num_action_types: int,
    allow_empty: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checks a behaviour sequence given as its parallel fields (a BehaviorSequence's repeated fields, or
    arrays) and returns them as int64 arrays; each failure names the field (`long_term.action_types`, ...).

    The counts are checked before anything is converted, so an oversized sequence costs nothing more. Works
    on arrays: converting a repeated field at once is ~30x faster than iterating it in Python, which matters
    for 8192-event histories on the ranking path.
    """
    n = len(item_ids)
    if n > max_events:
        raise InvalidArgument(f"{field}.item_ids", f"has {n} events, more than the limit of {max_events}")
    if len(action_types) != n:
        raise InvalidArgument(
            f"{field}.action_types", f"has {len(action_types)} entries but item_ids has {n}"
        )
    if len(timestamps_ms) not in (0, n):
        raise InvalidArgument(
            f"{field}.timestamps_ms", f"has {len(timestamps_ms)} entries but item_ids has {n}"
        )
    if n == 0 and not allow_empty:
        raise InvalidArgument(f"{field}.item_ids", "must not be empty")
    items = np.array(item_ids, dtype=np.int64)
    actions = np.array(action_types, dtype=np.int64)
    timestamps = np.array(timestamps_ms, dtype=np.int64)
    if n and items.min() < 0:
        raise InvalidArgument(f"{field}.item_ids", "must be non-negative")
    if n and (actions.min() < 0 or actions.max() >= num_action_types):
        raise InvalidArgument(f"{field}.action_types", f"must be in [0, {num_action_types})")
    if len(timestamps) and timestamps.min() < 0:
        raise InvalidArgument(f"{field}.timestamps_ms", "must be non-negative")
    return items, actions, timestamps


def behavior_sequence(
    seq: common_pb2.BehaviorSequence,
    field: str,
    max_events: int,
    num_action_types: int,
    allow_empty: bool,
) -> int:
    """Checks a BehaviorSequence and returns its length."""
    return len(sequence_arrays(seq, field, max_events, num_action_types, allow_empty)[0])


def candidates(item_ids, max_candidates: int, field: str = "candidate_item_ids") -> int:
    n = len(item_ids)
    if n == 0:
        raise InvalidArgument(field, "must not be empty")
    if n > max_candidates:
        raise InvalidArgument(field, f"has {n} candidates, more than the limit of {max_candidates}")
    if np.asarray(item_ids, dtype=np.int64).min() < 0:
        raise InvalidArgument(field, "must be non-negative")
    return n


def positive(value: int, field: str, limit: int) -> int:
    if value <= 0:
        raise InvalidArgument(field, "must be positive")
    if value > limit:
        raise InvalidArgument(field, f"is {value}, more than the limit of {limit}")
    return value
