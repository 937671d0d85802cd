"""LoadGen's system under test: every sample is one async `RecommendService.Recommend` call.

Threads. LoadGen calls `issue_queries` from its own issue thread (Server: once per query, at its scheduled
time; Offline: once, with every sample). The calls run on an asyncio event loop in a thread of this
object (`grpc.aio`), so issuing only hands each sample to that loop and returns at once: LoadGen's
schedule is never held up by a slow answer.

Completion contract. Every sample handed to `issue_queries` is completed exactly once, with
`mlperf_loadgen.QuerySamplesComplete`, when its call ends: answered, failed (any gRPC status or exception,
each call bounded by `timeout_s`), or refused because the SUT is closing. A failure is completed like an
answer (LoadGen has no failed state: it times the failure) and recorded with its status code, so that
the run can count it; no sample is lost and LoadGen never waits on one forever. At most `max_in_flight`
calls are outstanding; later samples wait for a slot, and LoadGen's latency includes that wait.

`answers` (after `close`) holds one `Answer` per sample, in completion order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Sequence

import grpc
import mlperf_loadgen as lg

from bench.mlperf.workload import StreamingUsers
from relaygr.v1 import recommend_pb2, recommend_pb2_grpc

OK = "OK"
NOT_SENT = "NOT_SENT"  # the SUT was closing when LoadGen issued the sample


@dataclasses.dataclass(frozen=True)
class Answer:
    """One sample's Recommend call: times are `time.perf_counter()` seconds."""

    sample_id: int  # LoadGen's response id
    index: int  # the QSL sample index
    user: str
    issued_s: float  # when LoadGen issued it
    latency_s: float  # issued to answered (or failed); LoadGen times from the scheduled issue
    code: str  # OK, a grpc.StatusCode name, or NOT_SENT
    details: str  # the error's message; empty when OK
    response: recommend_pb2.RecommendResponse | None  # None unless OK

    @property
    def ok(self) -> bool:
        return self.code == OK


class RecommendSUT:
    """Sends LoadGen's samples as Recommend calls to `target` (host:port). Use as a context manager:
    entering starts the loop thread and the channel, leaving closes them (after LoadGen has finished)."""

    def __init__(
        self, target: str, users: StreamingUsers, top_k: int, timeout_s: float, max_in_flight: int
    ) -> None:
        self.target = target
        self.users = users
        self.top_k = top_k
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recommend-sut", daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._channel: grpc.aio.Channel | None = None
        self._stub: recommend_pb2_grpc.RecommendServiceStub | None = None
        self._slots: asyncio.Semaphore | None = None

    def __enter__(self) -> RecommendSUT:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _open(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.target)
        self._stub = recommend_pb2_grpc.RecommendServiceStub(self._channel)
        self._slots = asyncio.Semaphore(self.max_in_flight)

    # ---- LoadGen's callbacks (its issue thread) ----

    def issue_queries(self, samples: Sequence[lg.QuerySample]) -> None:
        """Hands each sample to the loop; never blocks on a call."""
        issued = time.perf_counter()
        for sample in samples:
            try:
                if self._closing:
                    raise RuntimeError("closing")
                self._loop.call_soon_threadsafe(self._spawn, sample.id, sample.index, issued)
            except RuntimeError:  # closing, or the loop is closed: complete it now, as not sent
                self._complete(Answer(sample.id, sample.index, "", issued, 0.0, NOT_SENT, "closing", None))

    def flush_queries(self) -> None:
        """LoadGen will issue no more samples; the calls in flight finish on their own."""

    # ---- the loop thread ----

    def _spawn(self, sample_id: int, index: int, issued: float) -> None:
        task = self._loop.create_task(self._call(sample_id, index, issued))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, sample_id: int, index: int, issued: float) -> None:
        user, code, details, response = "", grpc.StatusCode.UNKNOWN.name, "", None
        try:
            user = self.users.user(index)
            async with self._slots:
                response = await self._stub.Recommend(
                    recommend_pb2.RecommendRequest(user_id=user, top_k=self.top_k), timeout=self.timeout_s
                )
            code = OK
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code().name, exc.details() or ""
        except BaseException as exc:  # cancelled at close, or a bug: still completed, as a failure
            code, details = grpc.StatusCode.UNKNOWN.name, repr(exc)
            if isinstance(exc, asyncio.CancelledError):
                code = grpc.StatusCode.CANCELLED.name
        finally:
            latency = time.perf_counter() - issued
            self._complete(Answer(sample_id, index, user, issued, latency, code, details, response))

    def _complete(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)
        lg.QuerySamplesComplete([lg.QuerySampleResponse(answer.sample_id, 0, 0)])

    # ---- shutdown ----

    def close(self) -> None:
        """Cancels calls still in flight (completing them as CANCELLED), closes the channel, stops the
        loop. Idempotent."""
        if self._closing:
            return
        self._closing = True
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._drain(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _drain(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
