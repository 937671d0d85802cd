"""The coalescer alone, with a recording `send`: each caller gets its own item's result, batches hold one
key and at most `max_size` items, none waits much past its window, a full batch does not wait, and a failed
call fails every caller of its batch."""

from __future__ import annotations

import asyncio
import contextvars

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.trigger.coalescer import Coalescer

# Loop scheduling on a busy two-core machine, on top of the window: a bound, not a speed.
SLACK_S = 1.0


class Sends:
    """Records each batch (key, items, loop time, timeout) and answers every item with (key, item), or with
    the exception `errors` names for it; `fail`: the whole call raises it."""

    def __init__(self, fail: Exception | None = None, errors: dict | None = None) -> None:
        self.batches: list[tuple[str, list, float, float]] = []
        self.fail, self.errors = fail, errors or {}

    async def __call__(self, key: str, items: list, timeout_s: float) -> list:
        self.batches.append((key, list(items), asyncio.get_running_loop().time(), timeout_s))
        await asyncio.sleep(0)  # answered later, as a call is
        if self.fail is not None:
            raise self.fail
        return [self.errors.get(item, (key, item)) for item in items]


@settings(max_examples=60, deadline=None)
@given(
    plan=st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([0.0, 0.0, 0.002, 0.02])), max_size=25),
    max_size=st.integers(1, 6),
)
def test_every_item_gets_its_own_answer_in_batches_of_one_key_within_the_size_and_the_window(plan, max_size):
    window_s = 0.01

    async def scenario():
        sends = Sends()
        coalescer = Coalescer(sends, window_s, max_size)
        loop = asyncio.get_running_loop()
        submitted: dict[int, tuple[str, float]] = {}
        callers = []
        for item, (key, pause) in enumerate(plan):
            await asyncio.sleep(pause)
            submitted[item] = (key, loop.time())
            callers.append(asyncio.ensure_future(coalescer.submit(key, item, timeout_s=5.0)))
        results = await asyncio.gather(*callers)
        assert results == [(key, item) for item, (key, _) in enumerate(plan)]
        sent = [item for _, items, _, _ in sends.batches for item in items]
        assert sorted(sent) == list(range(len(plan)))  # each item sent once
        for key, items, sent_at, _ in sends.batches:
            assert 1 <= len(items) <= max_size
            assert {submitted[item][0] for item in items} == {key}
            assert sent_at - min(submitted[item][1] for item in items) <= window_s + SLACK_S
        await coalescer.close()

    asyncio.run(scenario())


def test_a_full_batch_is_sent_at_once_without_waiting_for_its_window():
    async def scenario():
        sends = Sends()
        coalescer = Coalescer(sends, window_s=600.0, max_size=3)
        answers = await asyncio.wait_for(
            asyncio.gather(*(coalescer.submit("m", item, 5.0) for item in range(3))), timeout=60
        )
        assert answers == [("m", 0), ("m", 1), ("m", 2)]
        assert [items for _, items, _, _ in sends.batches] == [[0, 1, 2]]
        await coalescer.close()

    asyncio.run(scenario())


def test_a_failed_call_fails_every_caller_and_an_items_own_error_fails_only_it():
    async def scenario():
        down = RuntimeError("the call failed")
        coalescer = Coalescer(Sends(fail=down), window_s=0.01, max_size=8)
        outcomes = await asyncio.gather(
            *(coalescer.submit("m", item, 5.0) for item in range(3)), return_exceptions=True
        )
        assert outcomes == [down] * 3
        refused = ValueError("item 1 is bad")
        coalescer = Coalescer(Sends(errors={1: refused}), window_s=0.01, max_size=8)
        outcomes = await asyncio.gather(
            *(coalescer.submit("m", item, 5.0) for item in range(3)), return_exceptions=True
        )
        assert outcomes == [("m", 0), refused, ("m", 2)]

    asyncio.run(scenario())


def test_the_call_gets_the_time_its_earliest_item_has_left_and_a_gone_callers_item_is_left_out():
    async def scenario():
        sends = Sends()
        coalescer = Coalescer(sends, window_s=0.05, max_size=8)
        patient = asyncio.ensure_future(coalescer.submit("m", "patient", timeout_s=30.0))
        hurried = asyncio.ensure_future(coalescer.submit("m", "hurried", timeout_s=10.0))
        gone = asyncio.ensure_future(coalescer.submit("m", "gone", timeout_s=30.0))
        await asyncio.sleep(0)
        gone.cancel()
        assert await patient == ("m", "patient") and await hurried == ("m", "hurried")
        ((_, items, _, timeout_s),) = sends.batches
        assert items == ["patient", "hurried"]
        assert 0 < timeout_s <= 10.0

    asyncio.run(scenario())


def test_closing_cancels_the_callers_still_gathering():
    async def scenario():
        sends = Sends()
        coalescer = Coalescer(sends, window_s=600.0, max_size=8)
        waiting = asyncio.ensure_future(coalescer.submit("m", 1, 5.0))
        await asyncio.sleep(0)
        await coalescer.close()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert sends.batches == []

    asyncio.run(scenario())


CALLER = contextvars.ContextVar("caller", default="none")


@pytest.mark.parametrize("max_size", [2, 8], ids=["filled", "timed-out"])
def test_the_call_runs_in_the_context_of_the_caller_that_opened_the_batch(max_size):
    """A traced call has one parent: the opener's trace, whether the window or the last caller closed it."""

    async def scenario():
        seen = []

        async def send(key, items, timeout_s):
            seen.append(CALLER.get())
            return items

        coalescer = Coalescer(send, window_s=0.01, max_size=max_size)

        async def caller(name: str) -> str:
            CALLER.set(name)
            return await coalescer.submit("m", name, 5.0)

        first = asyncio.ensure_future(caller("opener"))
        await asyncio.sleep(0)
        assert await asyncio.gather(first, caller("closer")) == ["opener", "closer"]
        assert seen == ["opener"]

    asyncio.run(scenario())


@pytest.mark.parametrize("window_s, max_size", [(0.0, 4), (0.01, 0)])
def test_a_coalescer_needs_a_window_and_room(window_s, max_size):
    with pytest.raises(ValueError):
        Coalescer(Sends(), window_s, max_size)


def test_a_quiet_members_item_goes_at_once_and_windows_open_again_once_its_items_come_closer():
    """Gaps measured by an injected clock; the 600 s window never elapses here, so an item that waited for
    one would never be answered."""

    async def scenario():
        sends, now = Sends(), [0.0]
        coalescer = Coalescer(sends, window_s=600.0, max_size=2, clock=lambda: now[0])

        async def submit(*items):
            return await asyncio.wait_for(asyncio.gather(*(coalescer.submit("m", i, 5.0) for i in items)), 60)

        assert await submit("a", "b") == [("m", "a"), ("m", "b")]  # no gap measured yet: a (full) window
        now[0] = 3000.0
        assert await submit("c") == [("m", "c")]  # the gaps' average: 0 + (3000 - 0) / 4 > 600 s, at once
        now[0] = 3001.0
        assert await submit("d", "e") == [("m", "d"), ("m", "e")]  # 750 + (1 - 750) / 4 < 600 s: a window
        assert [items for _, items, _, _ in sends.batches] == [["a", "b"], ["c"], ["d", "e"]]
        await coalescer.close()

    asyncio.run(scenario())
