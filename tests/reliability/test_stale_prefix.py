"""A stale prefix is never used: whatever a user's history became since a prefix was cached, every score
equals a full recomputation of the exact sequence the Rank carries.

Property-based: hypothesis draws a user's history and a series of changes to it — an item or an action
replaced, the history truncated, extended, or replaced outright, timestamps appearing — and between
changes pre-infers (or not), lets the cache settle (or not), and ranks. One in-process ranker serves every
example over loopback gRPC, so entries of earlier steps (in HBM, in DRAM, in production) are there to be
wrongly reused; each user id is new per example, so examples do not see each other's entries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaygr.v1 import common_pb2, ranker_pb2
from services.ranker.model.events import Events
from tests.exact import assert_scores_equal
from tests.ranker.harness import Ranker, running_ranker

ITEMS = st.integers(0, 40)  # a small catalogue, so that changed and unchanged events often look alike
ACTIONS = st.integers(0, 4)
SHORT = common_pb2.BehaviorSequence(item_ids=[3, 1, 4], action_types=[1, 0, 2])
CANDIDATES = [9, 2, 6, 5, 35]
USERS = itertools.count()


@dataclasses.dataclass(frozen=True)
class History:
    items: tuple[int, ...]
    actions: tuple[int, ...]
    timestamps: tuple[int, ...] = ()

    def proto(self) -> common_pb2.BehaviorSequence:
        return common_pb2.BehaviorSequence(
            item_ids=self.items, action_types=self.actions, timestamps_ms=self.timestamps
        )

    def events(self) -> Events:
        return Events.of(self.items, self.actions, self.timestamps)


def histories(min_size: int = 1, max_size: int = 60) -> st.SearchStrategy[History]:
    return st.lists(st.tuples(ITEMS, ACTIONS), min_size=min_size, max_size=max_size).map(
        lambda pairs: History(tuple(i for i, _ in pairs), tuple(a for _, a in pairs))
    )


@st.composite
def changed(draw, history: History) -> History:
    """`history` after one change a real user's history can undergo (or none)."""
    n = len(history.items)
    change = draw(st.sampled_from(["none", "item", "action", "truncate", "extend", "replace", "timestamps"]))
    items, actions = list(history.items), list(history.actions)
    if change == "item":
        at = draw(st.integers(0, n - 1))
        items[at] = draw(ITEMS.filter(lambda item: item != items[at]))
    elif change == "action":
        at = draw(st.integers(0, n - 1))
        actions[at] = draw(ACTIONS.filter(lambda action: action != actions[at]))
    elif change == "truncate" and n > 1:
        keep = draw(st.integers(1, n - 1))
        items, actions = items[:keep], actions[:keep]
    elif change == "extend":
        more = draw(histories(1, 20))
        items, actions = items + list(more.items), actions + list(more.actions)
    elif change == "replace":
        return draw(histories())
    elif change == "timestamps":
        return History(history.items, history.actions, tuple(range(1000, 1000 + n)))
    return History(tuple(items), tuple(actions))


@st.composite
def scenarios(draw) -> list[tuple[History, bool, bool]]:
    """Steps of (history to rank, pre-infer it first, let the cache settle before ranking)."""
    history = draw(histories())
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        history = draw(changed(history))
        steps.append((history, draw(st.booleans()), draw(st.booleans())))
    return steps


class ServedRanker:
    """An in-process ranker (and its gRPC client) on an event loop thread, driven from the test's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.ranker: Ranker | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),))
        self._thread.start()
        self._ready.wait(60)

    def call(self, make_awaitable):
        """Awaits `make_awaitable()` on the ranker's loop (gRPC calls must be made there too)."""

        async def wait():
            return await make_awaitable()

        return asyncio.run_coroutine_threadsafe(wait(), self.loop).result(30)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with running_ranker() as ranker:
            self.ranker = ranker
            self._ready.set()
            await self._stop.wait()

    def pre_infer(self, user: str, history: History) -> None:
        request = ranker_pb2.PreInferRequest(user_id=user, long_term=history.proto())
        self.call(lambda: self.ranker.stub.PreInfer(request, timeout=10))

    def rank(self, user: str, history: History) -> list[float]:
        request = ranker_pb2.RankRequest(
            user_id=user, long_term=history.proto(), short_term=SHORT, candidate_item_ids=CANDIDATES
        )
        return list(self.call(lambda: self.ranker.stub.Rank(request, timeout=10)).scores)

    def settle(self) -> None:
        self.call(self.ranker.settle)

    def reference(self, history: History) -> list[float]:
        short = Events.of(SHORT.item_ids, SHORT.action_types)
        return self.ranker.app.runner.full_sync(history.events(), short, CANDIDATES)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture(scope="module")
def served() -> Iterator[ServedRanker]:
    ranker = ServedRanker()
    yield ranker
    ranker.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=scenarios())
def test_every_score_equals_a_full_recompute_of_the_ranked_history(served: ServedRanker, steps) -> None:
    user = f"user-{next(USERS)}"
    for history, pre_infer, settle in steps:
        if pre_infer:
            served.pre_infer(user, history)
        if settle:
            served.settle()
        assert_scores_equal(served.rank(user, history), served.reference(history))
