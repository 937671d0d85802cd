"""A sender killed in the middle of an entry (SIGKILL during its drain's handoff) leaves the receiver as it
was: the torn entry is counted, nothing of it is indexed or held, and the receiver keeps serving exactly."""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest
from prometheus_client import REGISTRY

from relaygr.v1 import ranker_pb2_grpc
from services.launcher.procs import Processes
from services.ranker.cache.acquired import Source
from tests.exact import assert_scores_equal
from tests.ranker.handoff.support import fleet, history, ranked, reference
from tests.ranker.harness import CANDIDATES, SHORT, held_bytes
from tests.support.requests import rank_request

LONG = 4096  # cpu-tiny: 512 bytes a token, so an entry is 2 MiB, two chunks of 1 MiB
MIB = 1 << 20


def received(outcome: str | None = None) -> float:
    if outcome is None:
        return REGISTRY.get_sample_value("relaygr_handoff_received_bytes_total") or 0.0
    return REGISTRY.get_sample_value("relaygr_handoff_received_entries_total", {"outcome": outcome}) or 0.0


@pytest.mark.slow
def test_a_sender_killed_mid_entry_leaves_the_receiver_consistent():
    asyncio.run(_scenario())


async def _scenario() -> None:
    async with fleet(["a", "b"], max_long_term_events=LONG) as rankers:
        b = await rankers.start("b")
        args = [
            "--model-preset", "cpu-tiny", "--instance-name", "a", "--rankers", rankers.members,
            "--profile-lengths", "16,64", "--profile-repeats", "1", "--health-interval-s", "0.1",
            "--drain-min-s", "0", "--drain-grace-s", "5", "--max-long-term-events", str(LONG),
            # Half a MiB a second: the first chunk goes at once, the second two seconds later.
            "--handoff-rate-mb-s", "0.5", "--handoff-budget-s", "30",
        ]  # fmt: skip
        with Processes() as procs:
            a = procs.start("a", "services.ranker", "relaygr.v1.RankerService", args, port=rankers.ports["a"])
            await asyncio.to_thread(a.wait_healthy, 120)
            await rankers.routable()
            await asyncio.to_thread(_rank_users, a.address, range(3))
            before_bytes, before_torn = received(), received("torn")
            a.signal(signal.SIGTERM)
            await _until(lambda: received() >= before_bytes + MIB, "the first chunk to arrive")
            a.signal(signal.SIGKILL)
            await _until(lambda: received("torn") == before_torn + 1, "the receiver to see the stream torn")
            assert received() == before_bytes + MIB  # one chunk of one entry, and nothing more
        assert not b.cache.index.entries and b.cache.dram.used_bytes == 0 and len(b.cache.dram) == 0
        assert held_bytes(b.cache) == {"hbm": 0, "dram": 0}
        scores, source = await ranked(b, 0, LONG)
        assert source is Source.MISS
        assert_scores_equal(scores, reference(b, 0, LONG))


def _rank_users(address: str, users) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        for user in users:
            stub.Rank(
                rank_request(f"user-{user}", history(user, LONG), SHORT, CANDIDATES.tolist()), timeout=60
            )


async def _until(condition, what: str, timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"waited {timeout_s}s for {what}")
