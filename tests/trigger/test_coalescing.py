"""The trigger's data plane coalescing PreInfers, driven without gRPC: the single and batch transports are
fakes that record their calls. Which PreInfers go together, which go alone and why, and what a batch's
answer or failure does to each Admit's decision and to the fleet view."""

from __future__ import annotations

import asyncio

from relaygr.v1 import ranker_pb2
from services.common.config import load
from services.trigger.admission import Reason
from services.trigger.config import TriggerConfig
from services.trigger.dataplane import PreInferFailed, TriggerPlane
from tests.support.metrics import metric
from tests.trigger.test_dataplane import MEMBERS, Rankers, call, profile

ACCEPTED = ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED
# The fake profile's pre-inference: 0.5 ms + 0.008 ms an event. With a 30 ms relay window and a 2 ms batch
# window, a 300-event prefix (2.9 ms) waits for its batch; an 8000-event one (64.5 ms) would miss its Rank.
SHORT, LONG = 300, 8000


class Batches:
    """The PreInferBatch transport: records each call's (users, member), answers every entry ACCEPTED with a
    load report of its member (or, for the users in `refuse`, an entry error), or fails the call."""

    def __init__(self, fail: str = "", refuse: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.fail, self.refuse = fail, refuse

    async def __call__(self, payloads, user_ids, timeout_s, member):
        self.calls.append((list(user_ids), member))
        if self.fail:
            raise PreInferFailed(self.fail, "on the way")
        entries = [
            PreInferFailed("INVALID_ARGUMENT", f"requests[{i}].long_term: bad")
            if user in self.refuse
            else ranker_pb2.PreInferResponse(outcome=ACCEPTED, instance=member)
            for i, user in enumerate(user_ids)
        ]
        return ranker_pb2.LoadReport(instance=member, pre_infer_backlog_ms=7.0), entries


def plane(rankers: Rankers, batches: Batches, *flags: str, direct: bool = True) -> TriggerPlane:
    """Every request admitted (the policy is not what is checked); a generous PreInfer timeout, the relay
    window 30 ms, and `flags` on top; routing directly to MEMBERS unless not `direct`."""
    where = ["--rankers", "ranker-a=127.0.0.1:1,ranker-b=127.0.0.1:2"] if direct else ["--router", "r:1"]
    flags = ("--admit-all", "true", "--pre-infer-timeout-ms", "2000", "--relay-window-ms", "30", *flags)
    config = load(TriggerConfig, [*where, *flags], {})
    built = TriggerPlane(config, rankers, (lambda: MEMBERS) if direct else (lambda: None), batches)
    built.use_profile(profile())
    return built


async def admits(trigger: TriggerPlane, users: list[str], length: int = SHORT) -> list:
    return await asyncio.gather(*(trigger.admit(call(user, length, payload=user.encode())) for user in users))


def users_on(trigger: TriggerPlane, member: str, count: int, prefix: str = "user") -> list[str]:
    """`count` users that the trigger places on `member` (their ring owner): a window of one member's
    PreInfers holds them all (a window that closes with one sends it as a single call)."""
    names = (f"{prefix}-{i}" for i in range(10_000))
    return [name for name in names if trigger.fleet.target(name) == member][:count]


def alone(reason: str) -> float:
    return metric("relaygr_trigger_pre_infer_alone_total", reason=reason)


def test_concurrent_admits_go_as_one_batch_per_member_and_each_gets_its_own_answer():
    rankers, batches = Rankers(), Batches()
    trigger = plane(rankers, batches, "--pre-infer-batch-window-ms", "20")
    observed = []
    observe = trigger.fleet.observe
    trigger.fleet.observe = lambda report: (observed.append(report.instance), observe(report))
    users = users_on(trigger, "ranker-a", 4) + users_on(trigger, "ranker-b", 4)
    sizes = metric("relaygr_trigger_pre_infer_batch_size_count")

    decisions = asyncio.run(admits(trigger, users))

    assert rankers.calls == []
    assert sorted(user for batch, _ in batches.calls for user in batch) == sorted(users)
    members = [member for _, member in batches.calls]
    assert len(members) == len(set(members))  # one call per member
    for decision, user in zip(decisions, users, strict=True):
        (member,) = [member for batch, member in batches.calls if user in batch]
        assert (decision.reason, decision.relay_instance) == (Reason.ADMITTED, member)
    # Each batch's load report is taken once (its entries carry none: an empty report is no report).
    assert sorted(instance for instance in observed if instance) == sorted(members)
    assert metric("relaygr_trigger_pre_infer_batch_size_count") == sizes + len(members)


def test_batches_hold_at_most_the_maximum_and_a_lone_pre_infer_goes_as_a_single_call():
    rankers, batches = Rankers(), Batches()
    trigger = plane(rankers, batches, "--pre-infer-batch-window-ms", "20", "--pre-infer-batch-max", "2")
    users = users_on(trigger, "ranker-a", 7)
    asyncio.run(admits(trigger, users))
    assert [len(batch) for batch, _ in batches.calls] == [2, 2, 2]
    assert [user for _, user, _, _ in rankers.calls] == users[-1:]


def test_with_the_window_zero_every_pre_infer_goes_alone():
    rankers, batches = Rankers(), Batches()
    trigger = plane(rankers, batches, "--pre-infer-batch-window-ms", "0")
    before = alone("window_off")
    decisions = asyncio.run(admits(trigger, ["u1", "u2", "u3"]))
    assert all(d.admitted for d in decisions)
    assert (len(rankers.calls), batches.calls) == (3, [])
    assert alone("window_off") == before + 3


def test_through_a_router_every_pre_infer_goes_alone():
    rankers, batches = Rankers(), Batches()
    trigger = plane(rankers, batches, direct=False)
    before = alone("through_router")
    asyncio.run(admits(trigger, ["u1", "u2"]))
    assert (len(rankers.calls), batches.calls) == (2, [])
    assert alone("through_router") == before + 2


def test_a_prefix_that_would_miss_its_rank_goes_alone_at_once_while_the_others_gather():
    """A one-second window and a relay window of 1050 ms: the 300-event prefix (2.9 ms) waits for its batch,
    the 8000-event one (64.5 ms, past the relay window with the batch window) is sent alone at once, and
    its Admit is answered while the others still gather."""
    rankers, batches = Rankers(), Batches()
    trigger = plane(rankers, batches, "--pre-infer-batch-window-ms", "1000", "--relay-window-ms", "1050")
    before = alone("would_miss_rank")
    shorts = users_on(trigger, "ranker-a", 2, prefix="short")

    async def scenario():
        short = [asyncio.ensure_future(trigger.admit(call(u, SHORT, payload=u.encode()))) for u in shorts]
        long = asyncio.ensure_future(trigger.admit(call("long", LONG, payload=b"long")))
        done, _ = await asyncio.wait([long, *short], return_when=asyncio.FIRST_COMPLETED)
        assert done == {long} and long.result().reason is Reason.ADMITTED
        assert [user for _, user, _, _ in rankers.calls] == ["long"] and batches.calls == []
        await asyncio.gather(*short)

    asyncio.run(scenario())
    assert batches.calls == [(shorts, "ranker-a")]
    assert alone("would_miss_rank") == before + 1


def test_a_failed_batch_fails_each_admission_and_refunds_it():
    rankers, batches = Rankers(), Batches(fail="UNAVAILABLE")
    trigger = plane(rankers, batches, "--pre-infer-batch-window-ms", "20")
    failures = metric("relaygr_trigger_pre_infer_failures_total", code="UNAVAILABLE")
    users = users_on(trigger, "ranker-a", 3)
    decisions = asyncio.run(admits(trigger, users))
    assert [(d.reason, d.relay_instance) for d in decisions] == [(Reason.RANKER_REFUSED, "")] * 3
    assert metric("relaygr_trigger_pre_infer_failures_total", code="UNAVAILABLE") == failures + 3
    # Refunded: nothing stays reserved, and the same prefixes are no duplicates (admitted again).
    assert all(trigger.fleet.pre_infer_backlog_ms(member) == 0.0 for member in MEMBERS)
    assert all(trigger.fleet.unanswered_bytes(member) == 0 for member in MEMBERS)
    batches.fail = ""
    assert [d.reason for d in asyncio.run(admits(trigger, users))] == [Reason.ADMITTED] * 3


def test_an_entry_the_ranker_refused_fails_its_own_admission_only():
    batches = Batches()
    trigger = plane(Rankers(), batches, "--pre-infer-batch-window-ms", "20")
    users = users_on(trigger, "ranker-a", 3)
    batches.refuse = (users[1],)
    failures = metric("relaygr_trigger_pre_infer_failures_total", code="INVALID_ARGUMENT")
    decisions = asyncio.run(admits(trigger, users))
    assert [d.reason for d in decisions] == [Reason.ADMITTED, Reason.RANKER_REFUSED, Reason.ADMITTED]
    assert metric("relaygr_trigger_pre_infer_failures_total", code="INVALID_ARGUMENT") == failures + 1
