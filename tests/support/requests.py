"""Request builders: deterministic histories and the PreInfer and Rank requests made of them."""

from __future__ import annotations

from collections.abc import Sequence

from relaygr.v1 import common_pb2, ranker_pb2


def sequence(item_ids: Sequence[int]) -> common_pb2.BehaviorSequence:
    """`item_ids` as behaviour events, the i-th of action type i % 5 (every preset has at least 5)."""
    return common_pb2.BehaviorSequence(item_ids=item_ids, action_types=[i % 5 for i in range(len(item_ids))])


def history(user: int, length: int) -> list[int]:
    """User `user`'s deterministic long-term item ids, `length` of them, spread over a million items."""
    return [(user * 7919 + i * 104729) % 1_000_003 for i in range(length)]


def pre_infer_request(user_id: str, long: Sequence[int]) -> ranker_pb2.PreInferRequest:
    return ranker_pb2.PreInferRequest(user_id=user_id, long_term=sequence(long))


def rank_request(
    user_id: str,
    long: Sequence[int],
    short: Sequence[int],
    candidates: Sequence[int],
    relay_instance: str = "",
    request_id: str = "",
) -> ranker_pb2.RankRequest:
    """A Rank of `candidates` for `user_id` with these long-term and short-term items; the request id is
    `req-<user_id>` unless given."""
    return ranker_pb2.RankRequest(
        request_id=request_id or f"req-{user_id}",
        user_id=user_id,
        long_term=sequence(long),
        short_term=sequence(short),
        candidate_item_ids=candidates,
        relay_instance=relay_instance,
    )
