"""The cache handoff between real rankers on loopback gRPC: a drain hands every entry to its user's next
owner byte for byte, a returning ranker reads its users' prefixes back, and Ranks from either equal a full
recomputation."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import types

import grpc
import pytest
import torch
from prometheus_client import REGISTRY

from relaygr.v1 import common_pb2, handoff_pb2, handoff_pb2_grpc, ranker_pb2, ranker_pb2_grpc
from relaygr.v1.handoff_pb2 import HandoffRefusal
from services.common.contract import HANDOFF_SERVICE
from services.ranker.cache import kv_wire
from services.ranker.cache.acquired import Source
from services.ranker.handoff.push import Pusher
from services.ranker.handoff.read_through import GIVE_UP_AFTER, TransferModel
from tests.exact import assert_scores_equal
from tests.ranker.handoff.support import cached, fleet, history, item_action_model, ranked, reference, run
from tests.ranker.harness import CANDIDATES, SHORT, events, held_bytes, settle
from tests.support.polling import eventually_equal
from tests.support.requests import rank_request

USERS = range(12)
ENTRY_BYTES = 40 * 512  # cpu-tiny: 512 bytes of KV a token, 40 events a history


def read_throughs(outcome: str) -> float:
    return REGISTRY.get_sample_value("relaygr_read_through_total", {"outcome": outcome}) or 0.0


def peer_ranks() -> float:
    """Ranks served from a prefix a peer gave, as the ranker's Rank counter has them."""
    return REGISTRY.get_sample_value("relaygr_rank_requests_total", {"cache_source": "peer"}) or 0.0


@run
async def test_a_drain_hands_each_entry_to_its_next_owner_byte_for_byte_and_ranks_stay_exact() -> None:
    async with fleet(["a", "b", "c"]) as rankers:
        for name in rankers.names:
            await rankers.start(name)
        await rankers.routable()
        a = rankers.apps["a"]
        entries = await cached(a, USERS)
        owners = {e.key: a.peers.next_owner(e.key.user_id).name for e in entries}
        sent = {e.key: e.dram.buffer.clone() for e in entries}
        assert set(owners.values()) == {"b", "c"}
        await rankers.stop("a")  # SIGTERM's path: NOT_SERVING, drain, handoff, stop
        summary = a.handed_off
        assert (summary.sent, summary.failed, summary.skipped_ttl, summary.skipped_time) == (12, 0, 0, 0)
        receipts = {r.instance: r for r in summary.receipts}
        assert sum(r.admitted for r in receipts.values()) == 12
        assert sum(r.received_bytes for r in receipts.values()) == summary.sent_bytes == 12 * ENTRY_BYTES
        for key, owner in owners.items():
            got = rankers.apps[owner].cache.index.get(key)
            assert got is not None and got.hbm is None and torch.equal(got.dram.buffer, sent[key])
        from_peers = peer_ranks()
        for user in (0, 1):
            owner = rankers.apps[owners[entries[user].key]]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{owner.grpc.port}") as channel:
                request = rank_request(f"user-{user}", history(user), SHORT, CANDIDATES.tolist())
                answer = await ranker_pb2_grpc.RankerServiceStub(channel).Rank(request, timeout=10)
            assert answer.cache_source == common_pb2.CACHE_SOURCE_PEER
            assert_scores_equal(answer.scores, reference(owner, user))
        assert peer_ranks() == from_peers + 2  # counted as the peer's, not as DRAM hits


@run
async def test_a_returning_ranker_reads_its_users_back_from_who_served_them_meanwhile() -> None:
    # A peer's answer takes milliseconds over loopback, more on a busy machine: the waits are generous.
    async with fleet(["a", "b", "c"], read_through_timeout_ms=10_000) as rankers:
        for name in ("b", "c"):  # "a" is away: its users are with their next owners
            await rankers.start(name)
        ring = rankers.apps["b"].peers.membership.ring
        ours = [u for u in range(60) if ring.owner(f"user-{u}") == "a"][:6]
        for user in ours:  # served by the member the routers send them to while "a" is away
            serving = next(name for name in ring.walk(f"user-{user}") if name != "a")
            await cached(rankers.apps[serving], [user])
        a = await rankers.start("a")
        await rankers.routable()
        hits, skipped = read_throughs("hit"), read_throughs("skipped")
        # A PreInfer's read-through is a prefetch: the prefix arrives, is reloaded and leased; its Rank
        # consumes it from HBM and computes nothing.
        first, second, third = ours[:3]
        await a.cache.pre_infer(f"user-{first}", events(history(first)))
        await _fetched(a)
        scores, source = await ranked(a, first)
        assert source is Source.PEER and read_throughs("hit") == hits + 1  # reloaded, leased: found in HBM
        assert_scores_equal(scores, reference(a, first))
        # A Rank reads through when the transfer is predicted to beat computing (here: free, against a
        # recomputation predicted to take 10 s, which is also how long it may wait) ...
        a.read_through.transfer = TransferModel(call_s=0.0, byte_s=0.0)
        a.read_through.load = types.SimpleNamespace(cost_ms=lambda path, tokens: 10_000.0)
        scores, source = await ranked(a, second)
        assert source is Source.PEER and read_throughs("hit") == hits + 2  # fetched, reloaded for the Rank
        assert_scores_equal(scores, reference(a, second))
        # ... and computes when it is not.
        a.read_through.transfer = TransferModel(call_s=10.0, byte_s=0.0)
        scores, source = await ranked(a, third)
        assert source is Source.MISS and read_throughs("skipped") == skipped + 1
        assert_scores_equal(scores, reference(a, third))
        # A user of another member's arcs is never read through: its owner pushes on its drain.
        theirs = next(u for u in range(60) if ring.owner(f"user-{u}") != "a")
        assert a.peers.source(f"user-{theirs}") is None


async def _fetched(app) -> None:
    """Waits until the ranker's prefetches have been answered and their productions have settled."""
    for _ in range(200):
        if not app.read_through._tasks:
            break
        await asyncio.sleep(0.01)
    await settle(app)


@run
async def test_peers_that_hold_nothing_are_asked_no_more_until_the_ring_changes() -> None:
    async with fleet(["a", "b", "c"], read_through_timeout_ms=10_000) as rankers:
        for name in rankers.names:  # started together: nobody holds anything
            await rankers.start(name)
        await rankers.routable()
        a = rankers.apps["a"]
        ring = a.peers.membership.ring
        ours = [u for u in range(400) if ring.owner(f"user-{u}") == "a"]
        misses = read_throughs("miss")
        for user in ours[: GIVE_UP_AFTER + 4]:
            await a.cache.pre_infer(f"user-{user}", events(history(user)))
            await _fetched(a)
        assert read_throughs("miss") == misses + GIVE_UP_AFTER
        await rankers.stop("c", drain=False)  # the routable members change: a new window
        await _until_unroutable(a, "c")
        user = ours[GIVE_UP_AFTER + 4]
        await a.cache.pre_infer(f"user-{user}", events(history(user)))
        await _fetched(a)
        assert read_throughs("miss") == misses + GIVE_UP_AFTER + 1


async def _until_unroutable(app, name: str) -> None:
    for _ in range(400):
        if not app.peers.membership.members[name].routable:
            return
        await asyncio.sleep(0.025)
    raise TimeoutError(f"{name} stayed routable")


@run
async def test_a_drains_second_round_sends_only_what_its_last_ranks_made() -> None:
    async with fleet(["a", "b"]) as rankers:
        for name in rankers.names:
            await rankers.start(name)
        await rankers.routable()
        a, b = rankers.apps["a"], rankers.apps["b"]
        await cached(a, [0, 1])
        pusher = Pusher(a.admission, a.peers, a.config)
        first = await pusher.push()  # as the drain begins
        assert (first.sent, first.sent_bytes) == (2, 2 * ENTRY_BYTES)
        await cached(a, [2])  # a Rank the drain still served
        second = await pusher.push()  # once it has drained
        assert (second.sent, second.sent_bytes) == (3, 3 * ENTRY_BYTES)
        assert sum(r.received_bytes for r in second.receipts) == 3 * ENTRY_BYTES
        assert sorted(e.key.user_id for e in b.cache.index) == ["user-0", "user-1", "user-2"]


@run
async def test_a_rank_that_waited_on_a_fetch_finding_nothing_joins_the_production_started_meanwhile() -> None:
    async with fleet(["a", "b"], read_through_timeout_ms=10_000) as rankers:
        for name in rankers.names:  # b holds nothing: every fetch finds nothing
            await rankers.start(name)
        await rankers.routable()
        a = rankers.apps["a"]
        ring = a.peers.ring
        users = [u for u in range(200) if ring.owner(f"user-{u}") == "a"][:4]
        misses = read_throughs("miss")
        for user in users:
            # The PreInfer's prefetch is in flight when its Rank arrives: the Rank waits on the same fetch,
            # which finds nothing; meanwhile the PreInfer may start the production. Either way the Rank
            # looks again, and joins it or starts it: never a second reservation of the same key.
            await a.cache.pre_infer(f"user-{user}", events(history(user)))
            scores, _ = await ranked(a, user)
            assert_scores_equal(scores, reference(a, user))
        assert read_throughs("miss") == misses + len(users)  # each waited on a fetch that found nothing
        await settle(a)
        assert a.cache.pins() == [] and len(a.cache.productions) == 0


@run
async def test_a_fetch_just_finished_is_not_waited_on_again() -> None:
    """A fetch that has finished stays listed until its done callback runs; a Rank scheduled before that
    callback must not take it for one under way (awaiting it would not yield: it would look again forever)."""
    async with fleet(["a", "b"]) as rankers:
        for name in rankers.names:
            await rankers.start(name)
        await rankers.routable()
        a = rankers.apps["a"]
        user = next(u for u in range(200) if a.peers.ring.owner(f"user-{u}") == "a")
        key = (f"user-{user}", events(history(user)).fingerprint)
        finished = asyncio.get_running_loop().create_future()
        finished.set_result(False)
        a.read_through._fetches[key] = finished
        a.read_through._asked[key] = None
        scores, source = await ranked(a, user)
        assert source is Source.MISS
        assert_scores_equal(scores, reference(a, user))


@run
async def test_once_a_peer_had_an_entry_empty_answers_do_not_end_the_asking() -> None:
    """A ranker back from a restart asks for each user as it returns; new users' empty answers come between
    and must not end it."""
    async with fleet(["a", "b"], read_through_timeout_ms=10_000) as rankers:
        for name in rankers.names:
            await rankers.start(name)
        await rankers.routable()
        a, b = rankers.apps["a"], rankers.apps["b"]
        ours = [u for u in range(400) if a.peers.source(f"user-{u}") is not None]
        await cached(b, ours[:1])  # b served this user of a's while a was away
        hits, misses = read_throughs("hit"), read_throughs("miss")
        for user in ours[: GIVE_UP_AFTER + 5]:
            await a.cache.pre_infer(f"user-{user}", events(history(user)))
            await _fetched(a)
        assert read_throughs("hit") == hits + 1
        assert read_throughs("miss") == misses + GIVE_UP_AFTER + 4  # every one asked


@run
async def test_an_item_action_models_prefixes_are_fetched_and_pushed_and_rank_exactly(tmp_path) -> None:
    """The layout of every imported recsys-examples checkpoint (two KV rows an event) hands off both ways:
    a returning ranker fetches its user's prefix, and a drain pushes the rest to their next owner."""
    model = item_action_model(tmp_path / "model")
    async with fleet(["a", "b"], checkpoint=model, read_through_timeout_ms=10_000) as rankers:
        b = await rankers.start("b")
        ring = b.peers.membership.ring
        ours = next(u for u in range(200) if ring.owner(f"user-{u}") == "a")
        await cached(b, [ours])  # b served a's user while a was away
        a = await rankers.start("a")
        await rankers.routable()
        hits = read_throughs("hit")
        await a.cache.pre_infer(f"user-{ours}", events(history(ours)))
        await _fetched(a)
        scores, source = await ranked(a, ours)
        assert source is Source.PEER and read_throughs("hit") == hits + 1
        assert_scores_equal(scores, reference(a, ours))
        theirs = [u for u in range(200) if ring.owner(f"user-{u}") == "b"][:3]
        entries = await cached(a, theirs)
        await rankers.stop("a")
        assert (a.handed_off.sent, a.handed_off.failed) == (4, 0)
        assert sum(r.admitted for r in a.handed_off.receipts) == 3  # b held `ours` already
        for user, entry in zip(theirs, entries, strict=True):
            got = b.cache.index.get(entry.key)
            assert got is not None and torch.equal(got.dram.buffer, entry.dram.buffer)
            scores, source = await ranked(b, user)
            assert source is Source.PEER
            assert_scores_equal(scores, reference(b, user))


async def _slow_peer(fleet_, delay_s: float):
    """b holds prefixes of users of a's arcs (served while a was away) and answers a Fetch `delay_s` late;
    a started after it. (a, b, those users)."""
    b = await fleet_.start("b")
    ring = b.peers.membership.ring
    ours = [u for u in range(400) if ring.owner(f"user-{u}") == "a"][:4]
    await cached(b, ours)
    payload = b.admission.payload

    async def slow(entry):
        await asyncio.sleep(delay_s)
        return await payload(entry)

    b.admission.payload = slow
    a = await fleet_.start("a")
    await fleet_.routable()
    return a, b, ours


@run
async def test_a_peer_that_times_out_is_learnt_and_rested_and_its_users_computed() -> None:
    async with fleet(["a", "b"], read_through_timeout_ms=200, read_through_backoff_s=600) as rankers:
        a, _, ours = await _slow_peer(rankers, delay_s=2.0)
        before = a.read_through.transfer.predict(40 * 512)
        timeouts, asked = read_throughs("timeout"), sum(map(read_throughs, ("hit", "miss", "timeout")))
        await a.cache.pre_infer(f"user-{ours[0]}", events(history(ours[0])))
        await _fetched(a)
        assert read_throughs("timeout") == timeouts + 1
        # The wait counts: the model now predicts at least the timeout for such a prefix ...
        assert a.read_through.transfer.predict(40 * 512) >= before + 0.2 * 0.2  # EWMA weight x timeout
        # ... and the peer rests: the next users are computed at once, never asked.
        for user in ours[1:]:
            await a.cache.pre_infer(f"user-{user}", events(history(user)))
            scores, source = await ranked(a, user)
            assert source is Source.HBM  # the PreInfer computed it
            assert_scores_equal(scores, reference(a, user))
        assert sum(map(read_throughs, ("hit", "miss", "timeout"))) == asked + 1
        assert not a.read_through._fetches


@run
async def test_fetches_in_flight_are_bounded_and_a_miss_beyond_them_computes() -> None:
    async with fleet(["a", "b"], read_through_timeout_ms=10_000, read_through_max_fetches=1) as rankers:
        a, _, ours = await _slow_peer(rankers, delay_s=0.5)
        first, second = ours[:2]
        await a.cache.pre_infer(f"user-{first}", events(history(first)))
        assert len(a.read_through._fetches) == 1
        await a.cache.pre_infer(f"user-{second}", events(history(second)))
        assert len(a.read_through._fetches) == 1  # not asked: its production started at once
        assert a.cache.key(f"user-{second}", events(history(second))) in a.cache.productions
        await _fetched(a)
        scores, source = await ranked(a, first)
        assert source is Source.PEER  # the first one's fetch did arrive
        assert_scores_equal(scores, reference(a, first))


@run
async def test_a_prefetching_pre_infer_is_refused_for_a_full_backlog_before_it_asks() -> None:
    async with fleet(["a", "b"], read_through_timeout_ms=10_000, max_pre_infer_backlog_ms=0.0) as rankers:
        a, _, ours = await _slow_peer(rankers, delay_s=0.0)
        assert not a.cache.load.calibration.provisional
        asked = sum(map(read_throughs, ("hit", "miss", "timeout")))
        outcome, _ = await a.cache.pre_infer(f"user-{ours[0]}", events(history(ours[0])))
        assert outcome == ranker_pb2.PreInferOutcome.PRE_INFER_OUTCOME_REJECTED_BACKLOG
        assert not a.read_through._fetches and sum(map(read_throughs, ("hit", "miss", "timeout"))) == asked


@run
async def test_a_push_skips_what_its_ttl_or_its_time_budget_would_not_let_arrive() -> None:
    """Planned at the handoff's rate (each entry 1 s here): an entry whose DRAM TTL runs out before it
    would arrive is skipped for its TTL, one that would arrive past the budget for time; and an entry
    whose turn comes once the deadline has passed mid-stream is not sent either."""
    async with fleet(["a", "b"], dram_ttl_s=60.0) as rankers:
        for name in rankers.names:
            await rankers.start(name)
        await rankers.routable()
        a, b = rankers.apps["a"], rankers.apps["b"]
        entries = await cached(a, [0, 1, 2, 3])  # most recently used last
        now = time.monotonic()
        a.cache.dram.touch(entries[0].key, now=now - 60.0 + 0.001)  # expires in 1 ms: cannot arrive
        offset = 0.0
        settings = dataclasses.replace(a.config, handoff_rate_mb_s=ENTRY_BYTES / 2**20, handoff_budget_s=2.5)
        pusher = Pusher(a.admission, a.peers, settings, clock=lambda: time.monotonic() + offset)
        payload = a.admission.payload

        async def late(entry):  # once the first entry is out, the rest of the budget is gone
            nonlocal offset
            if entry is not entries[3]:
                offset = 10.0
            return await payload(entry)

        a.admission.payload = late
        summary = await pusher.push()
        # Sent in recency order: 3 and 2 fit the budget (arriving at 1 s and 2 s), 1 would arrive at
        # 3 s; 0's TTL runs out first. Mid-stream, the deadline passed before 2's turn.
        assert (summary.sent, summary.skipped_ttl, summary.skipped_time, summary.failed) == (1, 1, 2, 0)
        assert [e.key for e in b.cache.index] == [entries[3].key]
        assert sum(r.admitted for r in summary.receipts) == 1


def rpcs(kind: str, method: str, code: str) -> float:
    labels = {"grpc_type": kind, "grpc_service": HANDOFF_SERVICE, "grpc_method": method, "grpc_code": code}
    return REGISTRY.get_sample_value("grpc_server_handled_total", labels) or 0.0


@run
async def test_a_pushs_receipt_counts_only_entries_the_receiver_holds_when_it_ends() -> None:
    """Entries resident in HBM go out as used just now (`idle_s` 0), each a little later on the receiver's
    clock than the one before: none may evict one that the same stream admitted, so a receiver that fits
    two of five admits two, holds two, and says two."""
    overrides = dict(dram_budget_mb=2.5 * ENTRY_BYTES / 2**20, lease_ttl_ms=600_000, read_through_grace_s=0)
    async with fleet(["a", "b"], **overrides) as rankers:
        for name in rankers.names:
            await rankers.start(name)
        await rankers.routable()
        a, b = rankers.apps["a"], rankers.apps["b"]
        users = range(5)
        for user in users:
            await a.cache.pre_infer(f"user-{user}", events(history(user)))
        await settle(a)
        resident = a.admission.resident()
        assert len(resident) == 5 and all(e.hbm is not None and e.lease is not None for e in resident)
        summary = await Pusher(a.admission, a.peers, a.config).push()
        assert (summary.sent, summary.failed) == (5, 0)
        (receipt,) = summary.receipts
        present = [e for e in b.cache.index if e.dram is not None]
        assert receipt.admitted == len(present) == 2
        assert receipt.admitted_bytes == held_bytes(b.cache)["dram"] == 2 * ENTRY_BYTES
        refused = {(r.reason, r.entries) for r in receipt.refused}
        assert refused == {(HandoffRefusal.HANDOFF_REFUSAL_BUDGET, 3)}


@run
async def test_push_and_fetch_are_counted_in_the_rpc_metrics_with_their_codes() -> None:
    async with fleet(["a", "b"], read_through_grace_s=0) as rankers:
        for name in rankers.names:
            await rankers.start(name)
        await rankers.routable()
        a, b = rankers.apps["a"], rankers.apps["b"]
        pushed, fetched = rpcs("client_stream", "Push", "OK"), rpcs("server_stream", "Fetch", "OK")
        invalid = rpcs("server_stream", "Fetch", "INVALID_ARGUMENT")
        entries = await cached(a, [0])
        summary = await Pusher(a.admission, a.peers, a.config).push()
        assert sum(r.admitted for r in summary.receipts) == 1
        async with grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc.port}") as channel:
            stub = handoff_pb2_grpc.CacheHandoffServiceStub(channel)
            request = handoff_pb2.FetchRequest(
                user_id="user-0", model_version=b.runner.model_version, layout=b.admission.layout,
                long_term=kv_wire.sequence(entries[0].events),
            )  # fmt: skip
            answers = [answer async for answer in stub.Fetch(request, timeout=10)]
            assert sum(len(answer.chunk.data) for answer in answers) == ENTRY_BYTES
            with pytest.raises(grpc.aio.AioRpcError) as error:
                [answer async for answer in stub.Fetch(handoff_pb2.FetchRequest(), timeout=10)]
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The server counts a call just after its client has the status: wait for it, not for a time.
        await eventually_equal(
            lambda: (rpcs("client_stream", "Push", "OK"), rpcs("server_stream", "Fetch", "OK"),
                     rpcs("server_stream", "Fetch", "INVALID_ARGUMENT")),
            (pushed + 1, fetched + 1, invalid + 1), what="(Push OK, Fetch OK, Fetch INVALID_ARGUMENT)",
        )  # fmt: skip
        started = REGISTRY.get_sample_value(
            "grpc_server_handling_seconds_count",
            {"grpc_type": "client_stream", "grpc_service": HANDOFF_SERVICE, "grpc_method": "Push"},
        )
        assert started is not None and started >= 1
