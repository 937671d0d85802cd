"""The ranker reads PreInfer and Rank through wire views: the long-term history stays bytes, and a Rank
carrying the very bytes its PreInfer carried takes the events decoded then instead of decoding them again."""

from __future__ import annotations

import asyncio
import itertools

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaygr.v1 import common_pb2, ranker_pb2
from services.ranker import wire
from tests.exact import assert_scores_equal
from tests.ranker.harness import running_ranker
from tests.support.requests import history, pre_infer_request, rank_request, sequence

HBM = common_pb2.CACHE_SOURCE_HBM
SHORT = [11, 12, 13]
CANDIDATES = [5, 99, 1234, 7, 42]

ids = st.lists(st.integers(0, 2**62), max_size=40)
sequences = st.builds(
    lambda items, ts: common_pb2.BehaviorSequence(
        item_ids=items, action_types=[i % 7 for i in items], timestamps_ms=ts[: len(items)] if ts else []
    ),
    ids,
    st.lists(st.integers(0, 2**62), max_size=40),
)


@settings(max_examples=200, deadline=None)
@given(
    user=st.text(max_size=20),
    request_id=st.text(max_size=20),
    long_term=sequences,
    short_term=sequences,
    candidates=ids,
    relay=st.text(max_size=20),
)
def test_the_rank_view_reads_every_field_as_the_contract_and_long_term_as_its_bytes(
    user, request_id, long_term, short_term, candidates, relay
):
    request = ranker_pb2.RankRequest(
        user_id=user,
        request_id=request_id,
        long_term=long_term,
        short_term=short_term,
        candidate_item_ids=candidates,
        relay_instance=relay,
    )
    view = wire.RankView.FromString(request.SerializeToString())
    assert (view.user_id, view.request_id, view.relay_instance) == (user, request_id, relay)
    assert list(view.candidate_item_ids) == candidates
    assert view.short_term.SerializeToString() == short_term.SerializeToString()
    assert wire.history(view) == long_term.SerializeToString()
    assert wire.sequence(wire.history(view), "long_term") == long_term


@settings(max_examples=100, deadline=None)
@given(user=st.text(max_size=20), long_term=sequences)
def test_the_pre_infer_view_reads_the_user_and_long_term_as_its_bytes(user, long_term):
    raw = ranker_pb2.PreInferRequest(user_id=user, long_term=long_term).SerializeToString()
    view = wire.PreInferView.FromString(raw)
    assert view.user_id == user
    assert wire.sequence(wire.history(view), "long_term") == long_term
    assert wire.digest(wire.history(view)) == wire.digest(long_term.SerializeToString())


@settings(max_examples=200, deadline=None)
@given(long_term=sequences, cuts=st.lists(st.integers(0, 40), max_size=3), rank=st.booleans())
def test_a_history_sent_in_pieces_reads_as_the_contract_merges_it(long_term, cuts, rank):
    """Protobuf merges every occurrence of a message field: a request sent as concatenated messages, each
    with a piece of the history, holds the whole history through the contract, and so through the view."""
    request = ranker_pb2.RankRequest if rank else ranker_pb2.PreInferRequest
    view = wire.RankView if rank else wire.PreInferView
    bounds = [0, *sorted(min(cut, len(long_term.item_ids)) for cut in cuts), len(long_term.item_ids)]
    pieces = [
        common_pb2.BehaviorSequence(
            item_ids=long_term.item_ids[start:end],
            action_types=long_term.action_types[start:end],
            timestamps_ms=long_term.timestamps_ms[start:end],
        )
        for start, end in itertools.pairwise(bounds)
    ]
    payload = b"".join(request(user_id="u", long_term=piece).SerializeToString() for piece in pieces)
    through_contract = request.FromString(payload).long_term
    read = wire.sequence(wire.history(view.FromString(payload)), "long_term")
    assert read == through_contract
    assert list(read.item_ids) == list(long_term.item_ids)


def test_a_rank_whose_history_comes_in_two_pieces_is_scored_on_the_whole_history():
    """[1, 2] + [3] is the history [1, 2, 3], scored exactly as a Rank that sends it in one piece."""

    async def scenario():
        async with running_ranker() as r:
            long = history(26, 40)
            first, second = relayed("u26", long[:25]), ranker_pb2.RankRequest(long_term=sequence(long[25:]))
            answer = ranker_pb2.RankResponse.FromString(
                await raw_rank(r, first.SerializeToString() + second.SerializeToString())
            )
            whole = await r.stub.Rank(rank_request("u26-whole", long, SHORT, CANDIDATES))
            assert_scores_equal(list(answer.scores), r.reference(long, SHORT, CANDIDATES))
            assert_scores_equal(list(answer.scores), list(whole.scores))

    asyncio.run(scenario())


def relayed(user: str, long: list[int]) -> ranker_pb2.RankRequest:
    return rank_request(user, long, SHORT, CANDIDATES, relay_instance="ranker-a")


def decode_counter(monkeypatch) -> list[str]:
    """Counts the histories the ranker decodes (the real decode runs)."""
    decoded: list[str] = []
    real = wire.sequence

    def counting(raw: bytes, field: str):
        decoded.append(field)
        return real(raw, field)

    monkeypatch.setattr(wire, "sequence", counting)
    return decoded


def test_a_relayed_rank_does_not_decode_the_history_its_pre_infer_decoded(monkeypatch):
    decoded = decode_counter(monkeypatch)

    async def scenario():
        async with running_ranker() as r:
            long = history(21, 60)
            await r.stub.PreInfer(pre_infer_request("u21", long))
            assert decoded == ["long_term"]
            await r.settle()
            ranked = await r.stub.Rank(relayed("u21", long))
            assert ranked.cache_source == HBM
            assert decoded == ["long_term"]  # the Rank took the PreInfer's events
            assert_scores_equal(list(ranked.scores), r.reference(long, SHORT, CANDIDATES))
            # Another user with the same history is another key: decoded, computed, and still exact.
            other = await r.stub.Rank(rank_request("u22", long, SHORT, CANDIDATES))
            assert other.cache_source == common_pb2.CACHE_SOURCE_MISS
            assert decoded == ["long_term", "long_term"]
            assert_scores_equal(list(other.scores), list(ranked.scores))

    asyncio.run(scenario())


def test_a_rank_joining_the_pre_inference_in_flight_takes_its_events(monkeypatch):
    decoded = decode_counter(monkeypatch)

    async def scenario():
        async with running_ranker(pre_infer_chunk_tokens=16) as r:
            long = history(23, 300)
            await r.stub.PreInfer(pre_infer_request("u23", long))
            ranked = await r.stub.Rank(relayed("u23", long))
            assert ranked.cache_source == HBM
            assert decoded == ["long_term"]
            assert_scores_equal(list(ranked.scores), r.reference(long, SHORT, CANDIDATES))

    asyncio.run(scenario())


def test_the_same_history_in_another_encoding_is_decoded_and_finds_its_prefix(monkeypatch):
    """Unpacked repeated fields are valid protobuf with other bytes: they miss the bytes' digest, are
    decoded, and key to the same prefix by their events."""
    decoded = decode_counter(monkeypatch)

    async def scenario():
        async with running_ranker() as r:
            long = history(24, 50)
            await r.stub.PreInfer(pre_infer_request("u24", long))
            await r.settle()
            packed = relayed("u24", long).SerializeToString()
            unpacked = _unpacked_long_term(packed, long)
            assert unpacked != packed
            ranked = ranker_pb2.RankResponse.FromString(await raw_rank(r, unpacked))
            assert ranked.cache_source == HBM
            assert decoded == ["long_term", "long_term"]
            assert_scores_equal(list(ranked.scores), r.reference(long, SHORT, CANDIDATES))

    asyncio.run(scenario())


async def raw_rank(r, payload: bytes) -> bytes:
    """A Rank sent as these very bytes; its answer's bytes."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{r.app.grpc.port}") as channel:
        return await channel.unary_unary("/relaygr.v1.RankerService/Rank")(payload)


def _unpacked_long_term(packed_request: bytes, long: list[int]) -> bytes:
    """The RankRequest with its long_term (field 3) re-encoded with unpacked repeated fields."""
    from google.protobuf.internal import encoder

    body = bytearray()
    for item, action in zip(long, sequence(long).action_types, strict=True):
        body += encoder.TagBytes(1, 0) + encoder._VarintBytes(item)
        body += encoder.TagBytes(2, 0) + encoder._VarintBytes(action)
    view = wire.RankView.FromString(packed_request)
    view.long_term[:] = [bytes(body)]
    return view.SerializeToString()


def test_long_term_bytes_that_are_no_sequence_are_invalid_argument_naming_long_term():
    async def scenario():
        async with running_ranker() as r:
            view = wire.RankView.FromString(relayed("u25", [1, 2]).SerializeToString())
            view.long_term[:] = [b"\x0a\xff\xff"]  # field 1, length-delimited, a length past the end
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await raw_rank(r, view.SerializeToString())
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith("long_term")

    asyncio.run(scenario())


@settings(max_examples=100, deadline=None)
@given(entries=st.lists(st.tuples(st.text(max_size=20), sequences), max_size=6))
def test_the_batch_view_reads_each_entry_as_the_pre_infer_view_does(entries):
    batch = ranker_pb2.PreInferBatchRequest(
        requests=[ranker_pb2.PreInferRequest(user_id=user, long_term=seq) for user, seq in entries]
    )
    view = wire.PreInferBatchView.FromString(batch.SerializeToString())
    assert [entry.user_id for entry in view.requests] == [user for user, _ in entries]
    for entry, (_, seq) in zip(view.requests, entries, strict=True):
        assert isinstance(entry, wire.PreInferView)
        assert wire.history(entry) == seq.SerializeToString()
        assert wire.sequence(wire.history(entry), "long_term") == seq


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(st.tuples(sequences, st.lists(st.integers(0, 40), max_size=3)), min_size=1, max_size=4)
)
def test_a_batch_whose_entries_carry_their_history_in_pieces_reads_as_the_contract_merges_them(entries):
    """Within an entry, a history sent in pieces (the entry's bytes are several PreInferRequests, each with a
    piece) merges, as a message field does; entries, occurrences of a repeated field, never merge."""
    requests = []
    for long_term, cuts in entries:
        bounds = [0, *sorted(min(cut, len(long_term.item_ids)) for cut in cuts), len(long_term.item_ids)]
        pieces = [
            ranker_pb2.PreInferRequest(
                user_id="u",
                long_term=common_pb2.BehaviorSequence(
                    item_ids=long_term.item_ids[start:end],
                    action_types=long_term.action_types[start:end],
                    timestamps_ms=long_term.timestamps_ms[start:end],
                ),
            ).SerializeToString()
            for start, end in itertools.pairwise(bounds)
        ]
        requests.append(b"".join(pieces))
    payload = b"".join(_entry_bytes(raw) for raw in requests)
    through_contract = ranker_pb2.PreInferBatchRequest.FromString(payload).requests
    through_view = wire.PreInferBatchView.FromString(payload).requests
    assert len(through_view) == len(through_contract) == len(entries)
    for viewed, contract, (long_term, _) in zip(through_view, through_contract, entries, strict=True):
        read = wire.sequence(wire.history(viewed), "long_term")
        assert read == contract.long_term
        assert list(read.item_ids) == list(long_term.item_ids)


def _entry_bytes(raw: bytes) -> bytes:
    """One occurrence of PreInferBatchRequest.requests (field 1, length-delimited) holding `raw` as is: the
    pieces of an entry's history stay pieces on the wire."""
    from google.protobuf.internal import encoder

    return encoder.TagBytes(1, 2) + encoder._VarintBytes(len(raw)) + raw
