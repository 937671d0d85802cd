"""cancel_and_wait: the tasks end however they end, and a cancellation of the caller is never swallowed."""

from __future__ import annotations

import asyncio
import contextlib

from services.common.tasks import cancel_and_wait


async def slow_to_stop(stopping: asyncio.Event, linger_s: float) -> None:
    """A task that, once cancelled, takes `linger_s` to clean up before it ends."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        stopping.set()
        await asyncio.sleep(linger_s)
        raise


async def fails() -> None:
    raise RuntimeError("boom")


def test_the_tasks_are_cancelled_and_finished_whatever_their_outcome() -> None:
    async def scenario() -> list[asyncio.Task]:
        stopping = asyncio.Event()
        tasks = [
            asyncio.create_task(slow_to_stop(stopping, 0.05)),
            asyncio.create_task(fails()),
            asyncio.create_task(asyncio.sleep(0)),
        ]
        await asyncio.sleep(0.01)  # the second has failed and the third finished; the first sleeps
        await cancel_and_wait(tasks)
        return tasks

    lingering, failed, finished = asyncio.run(scenario())
    assert lingering.cancelled()
    assert isinstance(failed.exception(), RuntimeError)
    assert finished.done() and not finished.cancelled() and finished.result() is None


def test_a_caller_cancelled_while_it_waits_stops_instead_of_carrying_on() -> None:
    """The trap it replaces: `with suppress(CancelledError): await task` swallowed the caller's own
    cancellation when it arrived during the wait, and a loop that was being shut down kept looping."""

    async def scenario(stop) -> tuple[bool, int]:
        """Whether the loop stopped when cancelled, and how many rounds it began."""
        rounds, give_up = 0, False
        stopping = asyncio.Event()

        async def loop_that_stops_a_task_each_round() -> None:
            nonlocal rounds
            while not give_up:
                rounds += 1
                task = asyncio.create_task(slow_to_stop(stopping, 0.1))
                await asyncio.sleep(0.01)  # the task is running: a refresh loop's member watcher, say
                await stop(task)
                stopping.clear()

        looping = asyncio.create_task(loop_that_stops_a_task_each_round())
        await stopping.wait()  # the loop is inside its wait for a task that takes 0.1 s to stop
        looping.cancel()
        done, _ = await asyncio.wait({looping}, timeout=0.5)
        give_up = True  # ends a loop that swallowed its cancellation
        await asyncio.wait({looping})
        return bool(done) and looping.cancelled(), rounds

    async def swallowing(task: asyncio.Task) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def helper(task: asyncio.Task) -> None:
        await cancel_and_wait([task])

    assert asyncio.run(scenario(helper)) == (True, 1)
    stopped, rounds = asyncio.run(scenario(swallowing))
    assert not stopped and rounds > 1
