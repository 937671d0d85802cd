"""One LoadGen test against one RecommendService: TestSettings, the QSL, the SUT, and the result.

`run_loadgen` builds LoadGen's `TestSettings` from the settings (`loadgen_settings`), a QSL of the run's users
(sample index i is user i, `bench.mlperf.workload.StreamingUsers`; nothing to load: the stub holds the
histories), and a `RecommendSUT`; runs `StartTestWithLogSettings` with LoadGen's logs going to `folder`
(`mlperf_log_summary.txt`, `mlperf_log_detail.txt`; no trace), and returns (and writes, as result.json
and summary.md in `folder`) the run's `RunResult`. It returns only once LoadGen has every sample
completed, and leaves no thread or channel behind.

Settings: Server is PerformanceOnly with Poisson arrivals at `target_qps`, `server_target_latency_ns` the
P99 target and `server_target_latency_percentile` 0.99; Offline issues every sample at once with
`offline_expected_qps` = `target_qps`. Both: `min_duration` from the duration, `min_query_count` as given,
the seed as LoadGen's schedule, sample-index and QSL seeds.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import mlperf_loadgen as lg

from bench.mlperf import report
from bench.mlperf.config import MlperfConfig
from bench.mlperf.results import RunResult, RunSettings, write_json
from bench.mlperf.summary import read_summary
from bench.mlperf.sut import RecommendSUT
from bench.mlperf.tally import history, latencies, prefix_wait, ranked, tiers
from bench.mlperf.workload import StreamingUsers, expected_queries, namespace, user_count

SCENARIOS = {"Server": lg.TestScenario.Server, "Offline": lg.TestScenario.Offline}
PERCENTILE = 0.99


def run_settings(
    config: MlperfConfig, mode: str, target: str, target_qps: float, relay_window_ms: float | None, label: str
) -> RunSettings:
    """One run's settings: the config's, at `target_qps`, against `target`; its users are named after
    `label` (the same in every mode), the load and the seed, and sized for `visits_per_user` visits each."""
    c = config
    queries = expected_queries(target_qps, c.duration_s, c.min_query_count)
    return RunSettings(
        mode=mode, target=target, scenario=c.scenario, target_qps=target_qps, p99_target_ms=c.p99_ms,
        duration_s=c.duration_s, min_query_count=c.min_query_count, seed=c.seed,
        max_in_flight=c.max_in_flight, timeout_s=c.timeout_s, max_error_fraction=c.max_error_fraction,
        top_k=c.top_k,
        relay_window_ms=relay_window_ms, namespace=namespace(label, target_qps, c.seed),
        users=user_count(queries, c.visits_per_user, c.users),
    )  # fmt: skip


def loadgen_settings(settings: RunSettings) -> lg.TestSettings:
    """LoadGen's settings for one run (PerformanceOnly)."""
    s = lg.TestSettings()
    s.scenario = SCENARIOS[settings.scenario]
    s.mode = lg.TestMode.PerformanceOnly
    s.server_target_qps = settings.target_qps
    s.server_target_latency_ns = round(settings.p99_target_ms * 1e6)
    s.server_target_latency_percentile = PERCENTILE
    s.offline_expected_qps = settings.target_qps
    s.min_duration_ms = round(settings.duration_s * 1000)
    s.min_query_count = settings.min_query_count
    s.qsl_rng_seed = s.sample_index_rng_seed = s.schedule_rng_seed = settings.seed
    return s


def log_settings(folder: Path) -> lg.LogSettings:
    """LoadGen's logs into `folder`, without its trace."""
    logs = lg.LogSettings()
    logs.log_output.outdir = str(folder)
    logs.log_output.copy_summary_to_stdout = False
    logs.enable_trace = False
    return logs


def run_loadgen(settings: RunSettings, folder: Path, short_term: int) -> RunResult:
    """Runs one LoadGen test against `settings.target` and writes its result into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    users = StreamingUsers(settings.namespace, settings.users)
    started = time.perf_counter()
    with RecommendSUT(
        settings.target, users, top_k=settings.top_k, timeout_s=settings.timeout_s,
        max_in_flight=settings.max_in_flight,
    ) as sut:  # fmt: skip
        sut_handle = lg.ConstructSUT(sut.issue_queries, sut.flush_queries)
        qsl = lg.ConstructQSL(users.count, users.count, _nothing_to_load, _nothing_to_load)
        _start_test(sut_handle, qsl, settings, folder)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut_handle)
    answers = sut.answers
    wall_s = time.perf_counter() - started
    failed = collections.Counter(a.code for a in answers if not a.ok)
    summary = read_summary(folder)
    answered = ranked(answers)
    visited = {a.user for a in answered}
    result = RunResult(
        settings=settings,
        loadgen=summary,
        completed=len(answers),
        failed=sum(failed.values()),
        error_codes=dict(failed),
        valid=summary.valid and sum(failed.values()) <= settings.max_error_fraction * len(answers),
        tiers=tiers(answers),
        history=history(answers, short_term),
        prefix_wait_ms=prefix_wait(answers),
        rank_ms=latencies([a.response.rank_latency_ms for a in answered]),
        recommend_ms=latencies([a.latency_s * 1000 for a in answered]),
        distinct_users=len(visited),
        visits_per_user=round(len(answered) / len(visited), 2) if visited else 0.0,
        wall_s=round(wall_s, 1),
    )
    write_json(result, folder / "result.json")
    (folder / "summary.md").write_text(report.run_markdown(result))
    return result


def _start_test(sut_handle: int, qsl: int, settings: RunSettings, folder: Path) -> None:
    """Runs LoadGen's test on a thread of its own and waits for it there, so that the main thread still
    takes Ctrl-C (KeyboardInterrupt propagates with LoadGen still running: the process must then exit,
    `bench.mlperf.__main__` does). The audit file is looked for in the run's folder, where there is none."""
    failures: list[BaseException] = []

    def start() -> None:
        try:
            audit = str(folder / "audit.config")
            lg.StartTestWithLogSettings(
                sut_handle, qsl, loadgen_settings(settings), log_settings(folder), audit
            )
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=start, name="loadgen", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    if failures:
        raise failures[0]


def _nothing_to_load(indices: list[int]) -> None:
    """The QSL's load/unload callbacks: the stub's universe holds every user's history."""
