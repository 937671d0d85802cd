"""`python -m bench gain-stability`: how stable the trigger's gain test is across restarts of a ranker.

The break-even (the shortest history relay pays for) and the NO_GAIN share of the first mix after three
restarts of a ranker's warm-up, the third while two other processes keep both cores busy (as a ranker
restarted in a busy cluster would). Each restart is a fresh process that measures the latency curve exactly
as a benchmark ranker does (the benchmark's `--ranker-profile-lengths`, 2 repeats, one torch thread) and
fits it as the trigger does. Beside the shipped rule (the pre-inference path's fitted work against the
trigger's `--relay-overhead-ms`) it evaluates the rule it replaced on the same curves (a miss's fit minus a
cached rank's, absolute-error least squares). Writes `--out`/results.json (bench/results/gain-stability/).
"""

import dataclasses
import json
import math
import multiprocessing
import subprocess
import sys
from collections.abc import Sequence

import numpy as np

from bench.lib.config import BenchConfig
from services.common.config import listed, load, setting
from services.launcher.procs import REPO_ROOT
from services.trigger.config import TriggerConfig
from services.trigger.cost_model import CostModel, _nonnegative_least_squares
from services.trigger.cost_model import Path as ModelPath

CANDIDATES = 128  # the rankers' --profile-candidates default
HOG = "import torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\nwhile True:\n    a @ a\n"


@dataclasses.dataclass(frozen=True)
class GainStability:
    out: str = setting(
        "bench/results/gain-stability", "results.json goes to this folder (repository-relative)"
    )


def warm_up(config: BenchConfig) -> list[dict[str, float]]:
    from bench.lib.floor import model_floor

    lengths = listed(config, "ranker_profile_lengths")
    threads, short, chunk = config.torch_threads, config.short_term, config.pre_infer_chunk_tokens
    points = model_floor("cpu-small", threads, lengths, short, CANDIDATES, 2, chunk)
    return [vars(point) for point in points]


def absolute_fit(points: list[tuple[int, float]], path: ModelPath, short: int) -> CostModel:
    lengths = [n for n, _ in points]
    latencies = np.minimum.accumulate(np.array([ms for _, ms in points])[::-1])[::-1]
    features = np.array([[1.0, *path.features(n, short, CANDIDATES)] for n in lengths])
    fixed, per_token, per_pair = _nonnegative_least_squares(features, latencies).tolist()
    return CostModel(fixed, per_token, per_pair, path)


def break_even(gain, overhead_ms: float) -> int:
    """The shortest history relay pays for (gain is non-decreasing in the length)."""
    return next(n for n in range(1, 100_000) if gain(n) > overhead_ms)


def share_below(length: int, config: BenchConfig) -> float:
    """Share of mix 1's lognormal histories shorter than `length` (the cap is far above any break-even)."""
    z = (math.log(length) - math.log(config.mix_median)) / config.mix_sigma
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def main(argv: Sequence[str] | None = None) -> None:
    settings = load(GainStability, argv, prog="python -m bench gain-stability", description=__doc__)
    out = REPO_ROOT / settings.out
    config = load(BenchConfig, [], {})
    overhead = TriggerConfig().relay_overhead_ms
    short = config.short_term
    runs = []
    for restart, busy in enumerate((False, False, True)):
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2 if busy else 0)]
        try:
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                curve = pool.apply(warm_up, (config,))
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        keys = ("full_ms", "pre_infer_ms", "rank_ms")
        column = {key: [(p["prefix_length"], p[key]) for p in curve] for key in keys}
        pre = CostModel.fit(column["pre_infer_ms"], 0, 0, ModelPath.PRE_INFER)
        full = absolute_fit(column["full_ms"], ModelPath.FULL, short)
        cached = absolute_fit(column["rank_ms"], ModelPath.CACHED, short)
        shipped = break_even(lambda n, pre=pre: pre.compute_ms(n, 0, 0), overhead)

        def saved(n: int, f: CostModel = full, c: CostModel = cached) -> float:
            return f.predict_ms(n, short, CANDIDATES) - c.predict_ms(n, short, CANDIDATES)

        replaced = break_even(saved, overhead)
        run = {
            "restart": restart,
            "busy_cores_beside": 2 if busy else 0,
            "curve": curve,
            "break_even": shipped,
            "no_gain_share": round(share_below(shipped, config), 4),
            "replaced_rule_break_even": replaced,
            "replaced_rule_no_gain_share": round(share_below(replaced, config), 4),
        }
        runs.append(run)
        print({k: v for k, v in run.items() if k != "curve"}, flush=True)
    shares = [run["no_gain_share"] for run in runs]
    old = [run["replaced_rule_no_gain_share"] for run in runs]
    summary = {
        "relay_overhead_ms": overhead,
        "mix": {"median": config.mix_median, "sigma": config.mix_sigma},
        "no_gain_share_spread_points": round(100 * (max(shares) - min(shares)), 2),
        "replaced_rule_spread_points": round(100 * (max(old) - min(old)), 2),
        "runs": runs,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    print({k: v for k, v in summary.items() if k != "runs"})


if __name__ == "__main__":
    main()
