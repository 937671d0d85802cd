"""Stopping asyncio tasks a component owns, without swallowing the cancellation of whoever stops them.

`task.cancel()` followed by `with suppress(CancelledError): await task` has a trap: when the *caller* is
cancelled while it waits (a refresh loop shut down while it is removing a member, say), the suppress
swallows the caller's own cancellation too, and the caller carries on as if nothing had asked it to stop.
`cancel_and_wait` waits with `asyncio.wait`, which never raises the tasks' outcomes, so only a
cancellation of the caller leaves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def cancel_and_wait(tasks: Iterable[asyncio.Task]) -> None:
    """Cancels `tasks` and returns once each has finished, whether cancelled, failed or done.

    Their exceptions are retrieved (so asyncio logs none as never retrieved) and dropped: a task's owner
    reports its failures where they happen. A cancellation of the caller while it waits propagates.
    """
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()
