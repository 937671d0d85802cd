"""`ThroughTarget` (the stub's and trigger's calls through `--router`) against a real router process stand-in:
a gRPC server that shuts down with calls queued, as a stopped router does.

gRPC's server shutdown cancels, at once and whatever the grace period, every call that had arrived but was
not yet taken up by the server's event loop: the caller sees CANCELLED. A Rank is idempotent, so
`ThroughTarget.rank` sends such a call once more, in the time left, and it reaches the replacement.
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from services.affinity.calls import ThroughTarget
from services.affinity.metrics import RANK_RETRIES
from services.common.config import ServiceConfig
from services.common.contract import RANKER_SERVICE
from tests.support.polling import eventually

CALLS = 24


class ServerThread:
    """A gRPC server answering Rank with `answer`, on its own event loop in a thread (so that its handler can
    block its loop without blocking the caller's), counting the calls its handler ran."""

    def __init__(self, answer: bytes, port: int = 0, busy_s: float = 0.0) -> None:
        self.answer = answer
        self.busy_s = busy_s
        self.handled = 0
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._server: grpc.aio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._run(self._start())

    def _run(self, coroutine) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    async def _start(self) -> None:
        async def rank(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.handled += 1
            # Blocks this server's event loop, as a busy router's is: calls arriving meanwhile wait in
            # gRPC's queue, not yet taken up by the server.
            time.sleep(self.busy_s)
            return self.answer

        self._server = grpc.aio.server()
        handlers = {"Rank": grpc.unary_unary_rpc_method_handler(rank)}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(RANKER_SERVICE, handlers),)
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self._server.start()

    def stop(self, grace_s: float) -> None:
        assert self._server is not None
        self._run(self._server.stop(grace_s))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def retries() -> dict[str, float]:
    return {code: RANK_RETRIES.labels(code)._value.get() for code in ("CANCELLED", "UNAVAILABLE")}


def test_ranks_a_stopping_router_cancels_unanswered_are_sent_again_to_its_replacement() -> None:
    first = ServerThread(b"first", busy_s=0.05)
    second: ServerThread | None = None
    before = retries()

    async def main() -> list[bytes]:
        nonlocal second
        calls = ThroughTarget(f"127.0.0.1:{first.port}", ServiceConfig())
        try:
            ranks = [asyncio.ensure_future(calls.rank(b"rank", "alice", "", 20.0)) for _ in range(CALLS)]
            # The first is being handled (its handler blocks the server), the others queue behind it.
            await eventually(lambda: first.handled >= 1, 10, "the first call handled", every_s=0.005)
            await asyncio.sleep(0.02)
            await asyncio.to_thread(first.stop, 5.0)
            second = await asyncio.to_thread(ServerThread, b"second", first.port)
            return await asyncio.gather(*ranks)
        finally:
            await calls.close()

    try:
        answers = asyncio.run(main())
    finally:
        if second is not None:
            second.stop(0)
    after = retries()
    retried = {code: after[code] - before[code] for code in after}

    # No call failed: each was answered by the stopped server before it stopped, or by its replacement.
    assert len(answers) == CALLS
    assert answers.count(b"first") == first.handled >= 1
    assert second is not None and answers.count(b"second") == second.handled >= 1
    # The mechanism: what the replacement answered had been dropped by the stopping server, CANCELLED
    # (queued, never handled), and was sent again, each once.
    assert retried["CANCELLED"] >= 1
    assert sum(retried.values()) == second.handled
    assert first.handled + second.handled == CALLS


def test_a_rank_the_router_answers_with_an_error_is_not_sent_again() -> None:
    async def main() -> None:
        server = grpc.aio.server()
        received = []

        async def rank(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            received.append(request)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")

        handlers = {"Rank": grpc.unary_unary_rpc_method_handler(rank)}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RANKER_SERVICE, handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        calls = ThroughTarget(f"127.0.0.1:{port}", ServiceConfig())
        try:
            before = retries()
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await calls.rank(b"rank", "alice", "", 5.0)
            assert (error.value.code(), error.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
            assert received == [b"rank"] and retries() == before
        finally:
            await calls.close()
            await server.stop(0)

    asyncio.run(main())
