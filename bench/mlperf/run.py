"""One LoadGen test against one RecommendService (`run_loadgen`): its settings, users, SUT and result.

Server is PerformanceOnly with Poisson arrivals at `target_qps` and the P99 target at percentile 0.99;
Offline issues every sample at once (`offline_expected_qps` = `target_qps`); both take `min_duration`,
`min_query_count` and the seed. LoadGen writes its logs into the run's folder (no trace), and the run's
`RunResult` goes beside them (result.json, summary.md).

The users have MLPerf DLRMv3's streaming shape (each user at successive timestamps, with a history longer by
the events since), written from its description, not its data. QSL sample i is user `<namespace>-u<i>`,
sized for `visits_per_user` visits each over the samples LoadGen issues; the namespace (universe, load,
seed) is new for every run and the same in every mode. A visit's history is what the stub's `universe` says
the user has done when the Recommend reaches it: a lognormal length at the run's start, capped (past the cap
a history slides and a cached prefix goes stale), then `growth_events_per_min` new events a minute (each
user within ±50 %). Events are only appended, so whatever order LoadGen draws indices in, a later visit sees
the longer history. The default sizes (median 256, cap 1024) suit a 2-core CPU running `cpu-small`: with
512 / 2048 the baseline missed the 80 ms target at 3 QPS already, so a search would measure the length limit.

The SUT is an adapter over the services' open-loop driver: LoadGen calls it from its own thread (Server: a
sample at each scheduled time; Offline: all at once), and each batch goes to `run_loadgen`'s asyncio loop,
where `services.loadgen.run_open_loop` sends it at once (an unbounded rate), a Recommend a sample bounded by
`timeout_s`, and records each call (`CallRecord`, `index` the QSL sample index, latency from LoadGen's
issue). At most `max_in_flight` calls are outstanding; later samples wait, inside their latency. Every
sample completes exactly once, answered or failed (a gRPC status, or UNKNOWN for an exception), so LoadGen
never waits forever; it times a failure like an answer, so the run counts failures itself. LoadGen runs on
its own thread so that Ctrl-C still reaches the main thread; it cannot be stopped mid-test, so the process
must then exit (`bench.mlperf.__main__` does).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import math
import time
from pathlib import Path

import grpc
import mlperf_loadgen as lg

from bench.lib.workload import Universe, mix_universe
from bench.mlperf import report
from bench.mlperf.config import MlperfConfig
from bench.mlperf.results import RunResult, RunSettings, read_summary, write_json
from bench.mlperf.tally import tally
from relaygr.v1 import recommend_pb2, recommend_pb2_grpc
from services.loadgen.openloop import CallRecord, run_open_loop

SCENARIOS = {"Server": lg.TestScenario.Server, "Offline": lg.TestScenario.Offline}
UNKNOWN = grpc.StatusCode.UNKNOWN


@dataclasses.dataclass(frozen=True)
class StreamingUsers:
    """The users of one LoadGen run: the QSL's sample index → user id mapping."""

    namespace: str
    count: int

    def user(self, index: int) -> str:
        """The user of QSL sample `index` (0 ≤ index < count)."""
        if not 0 <= index < self.count:
            raise IndexError(f"sample index {index} outside the QSL's {self.count} users")
        return f"{self.namespace}-u{index}"


def user_count(queries: int, visits_per_user: float, users: int = 0) -> int:
    """Users of a run of about `queries` samples: `users` when given, else queries / visits_per_user."""
    return users if users > 0 else max(1, math.ceil(queries / visits_per_user))


def universe(config: MlperfConfig, epoch_ms: int) -> Universe:
    """The stub's universe: `bench.lib.workload.mix_universe`'s lognormal length mix at its drawn lengths at
    `epoch_ms` (Unix ms), growing at `growth_events_per_min` from there."""
    c = config
    mix = mix_universe(c.history_median, c.history_sigma, c.history_max, c.short_term, c.universe_seed)
    extra = ("--growth-events-per-min", str(c.growth_events_per_min), "--universe-epoch-ms", str(epoch_ms))
    label = f"stream-{mix.label}-g{c.growth_events_per_min:g}"
    return dataclasses.replace(mix, label=label, stub_args=(*mix.stub_args, *extra))


def run_settings(config: MlperfConfig, mode: str, target: str, target_qps: float) -> RunSettings:
    """One run's settings: the config's, at `target_qps`, against `target` (mode `external`: a stub with its
    own relay window); its users are named after the universe, the load and the seed (the same in every
    mode)."""
    c = config
    queries = max(math.ceil(target_qps * c.duration_s), c.min_query_count)
    return RunSettings(
        mode=mode, target=target, scenario=c.scenario, target_qps=target_qps, p99_target_ms=c.p99_ms,
        duration_s=c.duration_s, min_query_count=c.min_query_count, seed=c.seed,
        max_in_flight=c.max_in_flight, timeout_s=c.timeout_s, max_error_fraction=c.max_error_fraction,
        top_k=c.top_k, relay_window_ms=None if mode == "external" else c.relay_window_ms,
        namespace=f"mlperf-{universe(c, 0).label}-q{target_qps:g}-s{c.seed}",
        users=user_count(queries, c.visits_per_user, c.users),
    )  # fmt: skip


def loadgen_settings(settings: RunSettings) -> lg.TestSettings:
    """LoadGen's settings for one run (PerformanceOnly)."""
    s = lg.TestSettings()
    s.scenario = SCENARIOS[settings.scenario]
    s.mode = lg.TestMode.PerformanceOnly
    s.server_target_qps = s.offline_expected_qps = settings.target_qps
    s.server_target_latency_ns = round(settings.p99_target_ms * 1e6)
    s.server_target_latency_percentile = 0.99
    s.min_duration_ms = round(settings.duration_s * 1000)
    s.min_query_count = settings.min_query_count
    s.qsl_rng_seed = s.sample_index_rng_seed = s.schedule_rng_seed = settings.seed
    return s


def run_loadgen(config: MlperfConfig, mode: str, target: str, target_qps: float, folder: Path) -> RunResult:
    """Runs one LoadGen test of `config` at `target_qps` against `target`; writes its result into `folder`."""
    settings = run_settings(config, mode, target, target_qps)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    records = asyncio.run(_test(settings, folder))
    wall_s = round(time.perf_counter() - started, 1)
    failed = collections.Counter(r.code.name for r in records if not r.ok)
    summary = read_summary(folder)
    result = RunResult(
        settings=settings, loadgen=summary, completed=len(records), failed=sum(failed.values()),
        error_codes=dict(failed),
        valid=summary.valid and sum(failed.values()) <= settings.max_error_fraction * len(records),
        **tally(records, config.short_term), wall_s=wall_s,
    )  # fmt: skip
    write_json(result, folder / "result.json")
    (folder / "summary.md").write_text(report.run_markdown(result))
    return result


async def _test(settings: RunSettings, folder: Path) -> list[CallRecord]:
    """LoadGen's test with the SUT (see the module's docstring): one record a sample, in completion order,
    its `index` the QSL sample index and its times `time.monotonic()` seconds."""
    loop = asyncio.get_running_loop()
    users = StreamingUsers(settings.namespace, settings.users)
    slots = asyncio.Semaphore(settings.max_in_flight)
    records: list[CallRecord] = []
    batches: list[concurrent.futures.Future[None]] = []

    def complete(sample_id: int, record: CallRecord) -> None:
        records.append(record)
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, 0, 0)])

    async with grpc.aio.insecure_channel(settings.target) as channel:
        stub = recommend_pb2_grpc.RecommendServiceStub(channel)

        async def recommend(request: recommend_pb2.RecommendRequest, **options: object) -> object:
            async with slots:
                return await stub.Recommend(request, **options)

        async def send(samples: list[tuple[int, int]], issued: float) -> None:
            pending = dict(enumerate(samples))
            lag = time.monotonic() - issued  # the loop's clock, as `issued`

            def done(record: CallRecord) -> None:
                if (sample := pending.pop(record.index, None)) is not None:
                    complete(sample[0], dataclasses.replace(
                        record, index=sample[1], intended_s=issued, sent_s=issued + lag + record.sent_s,
                        latency_s=lag + record.latency_s,
                    ))  # fmt: skip

            def request(i: int) -> recommend_pb2.RecommendRequest:
                return recommend_pb2.RecommendRequest(user_id=users.user(samples[i][1]), top_k=settings.top_k)

            try:
                await run_open_loop(
                    recommend, request, math.inf, total=len(samples), timeout_s=settings.timeout_s,
                    on_record=done, collect=False,
                )  # fmt: skip
            except BaseException as exc:  # a bug, or interrupted: the samples not answered still complete
                for sample_id, index in pending.values():
                    complete(sample_id, CallRecord(index, issued, issued, 0.0, UNKNOWN, repr(exc), None))
                pending.clear()

        def issue(query: list[lg.QuerySample]) -> None:  # LoadGen's issue thread: never blocks on a call
            batch = send([(sample.id, sample.index) for sample in query], time.monotonic())
            try:
                batches.append(asyncio.run_coroutine_threadsafe(batch, loop))
            except RuntimeError:  # the loop is gone: interrupted, the process is exiting
                batch.close()

        sut = lg.ConstructSUT(issue, lambda: None)
        qsl = lg.ConstructQSL(users.count, users.count, lambda _: None, lambda _: None)  # nothing to load
        logs = lg.LogSettings()
        logs.log_output.outdir = str(folder)
        logs.log_output.copy_summary_to_stdout = False
        logs.enable_trace = False
        audit = str(folder / "audit.config")  # LoadGen looks for one in the run's folder, where there is none
        # Not awaited when interrupted (the pool is never shut down then): LoadGen cannot be stopped.
        pool = concurrent.futures.ThreadPoolExecutor(1, "loadgen")
        test = (sut, qsl, loadgen_settings(settings), logs, audit)
        await loop.run_in_executor(pool, lg.StartTestWithLogSettings, *test)
        pool.shutdown()
        await asyncio.gather(*map(asyncio.wrap_future, batches))
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    return records
