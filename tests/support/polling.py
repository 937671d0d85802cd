"""Waiting until a condition holds, from a test's thread or from its event loop, failing the test when it
does not within the time given."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.1) -> float:
    """Polls `predicate` every `every_s` until it holds; returns when it did (time.monotonic())."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(every_s)
    return time.monotonic()


async def eventually(
    predicate: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition", every_s: float = 0.02
) -> None:
    """`wait_for` on an event loop: polls without blocking the loop the servers under test run on."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        await asyncio.sleep(every_s)


def wait_equal(
    read: Callable[[], T], expected: T, timeout_s: float, what: str, every_s: float = 0.05
) -> None:
    """Polls `read()` until it equals `expected`: how a test reads an effect that follows a response (a
    server counts a call's status after the client has it, a span is exported after its call ends)."""
    deadline = time.monotonic() + timeout_s
    while (seen := read()) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {seen!r} after {timeout_s:.0f}s, wanted {expected!r}")
        time.sleep(every_s)


async def eventually_equal(
    read: Callable[[], T], expected: T, timeout_s: float = 5.0, what: str = "value", every_s: float = 0.02
) -> None:
    """`wait_equal` on an event loop, without blocking the servers under test that run on it."""
    deadline = time.monotonic() + timeout_s
    while (seen := read()) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {seen!r} after {timeout_s}s, wanted {expected!r}")
        await asyncio.sleep(every_s)
