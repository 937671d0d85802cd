"""The ranker's device path on one device, in process, with the ranker's own components (`--measures
device`): the cached rank's error against the full recomputation by prefix length (in the preset's dtype);
the DRAM → HBM reload of `TierCopier.to_hbm` against one pinned host-to-device copy's peak; cached-rank
P50/P99 by length, one user and `--batch` users at a time; and on CUDA the same ranks replayed through
`RankGraphs` against the eager path. Writes results.json and report.md to `--out`. On CPU (the host pool
forced) it runs the same code, which is how the suite checks it; its times there mean nothing.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.lib import context, envelope
from bench.micro.accelerator.config import AcceleratorBenchConfig
from services.common.config import listed
from services.ranker.config import RankerConfig
from services.ranker.device.accelerator import Accelerator, select_device, synchronize
from services.ranker.device.copier import TierCopier
from services.ranker.device.graphs import RankGraphs
from services.ranker.device.host_pool import HostPool
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Scheduler
from services.ranker.model.events import Events
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset


def timer(accelerator: Accelerator) -> Callable[[Callable[[], Any]], float]:
    """Wall ms of device work: waits for the device before reading the clock (the host runs ahead)."""

    def ms(fn: Callable[[], Any]) -> float:
        synchronize(accelerator.device)  # measurement only, never on the serving path
        started = time.perf_counter()
        fn()
        synchronize(accelerator.device)
        return (time.perf_counter() - started) * 1000

    return ms


def percentile(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q))


def synthetic(length: int, seed: int, num_action_types: int) -> Events:
    rng = np.random.default_rng(seed)
    return Events.of(rng.integers(0, 2**40, length), rng.integers(0, num_action_types, length))


def measure_epsilon(runner: ModelRunner, config: AcceleratorBenchConfig) -> list[dict[str, Any]]:
    """Max |cached - full| score per length, the full pass being the model's one-pass reference."""
    preset, rows = runner.model.preset, []
    short = synthetic(config.short_term, 1, preset.num_action_types)
    candidates = np.random.default_rng(2).integers(0, 2**40, config.candidates).tolist()
    for length in listed(config, "lengths"):
        long = synthetic(length, length, preset.num_action_types)
        cached = torch.tensor(runner.rank_sync(runner.build_sync(long, False), short, candidates))
        full = torch.tensor(runner.full_sync(long, short, candidates))
        rows.append({"length": length, "max_abs": float((cached - full).abs().max())})
    return rows


def measure_reload(runner: ModelRunner, accelerator: Accelerator, config: AcceleratorBenchConfig) -> dict:
    """Reload bandwidth of the longest prefix through the host pool, against one pinned H2D copy's peak."""
    preset, ms = runner.model.preset, timer(accelerator)
    length = listed(config, "lengths")[-1]
    kv = runner.build_sync(synthetic(length, 3, preset.num_action_types), False).wait()
    nbytes = kv.nbytes()
    capacity = nbytes + 4096  # room for the pool's slab alignment
    pool = HostPool(capacity, accelerator.pinned(capacity))
    copier = TierCopier(accelerator, preset.dtype, preset.dtype, pool)
    dram = copier.to_dram(kv)
    assert torch.equal(dram.buffer.to(kv.device), kv.buffer), "the DRAM copy differs from the entry"

    def reload() -> None:
        for marker in copier.to_hbm(dram).ready or ():
            marker.synchronize()

    source = pool.view(pool.slabs()[0], (nbytes,), torch.uint8)
    target = torch.empty(nbytes, dtype=torch.uint8, device=accelerator.device)
    peak_ms = [ms(lambda: target.copy_(source, non_blocking=True)) for _ in range(config.repeats)]
    reload_ms = [ms(reload) for _ in range(config.repeats)]
    reloaded = copier.to_hbm(dram).wait()
    assert torch.equal(reloaded.buffer, kv.buffer), "the reloaded entry differs from the original"
    peak, achieved = nbytes / min(peak_ms) / 1e6, nbytes / statistics.median(reload_ms) / 1e6
    return {"length": length, "bytes": nbytes, "layers": preset.num_layers, "pinned_h2d_peak_gb_s": peak,
            "reload_median_gb_s": achieved, "reload_median_ms": statistics.median(reload_ms),
            "fraction_of_peak": achieved / peak}  # fmt: skip


def rank_items(runner: ModelRunner, config: AcceleratorBenchConfig, length: int, seed: int) -> list:
    """`--batch` users' cached ranks at `length`: their prefixes built, one short-term sequence and one
    candidate list shared (drawn from `seed` and `seed + 1`; the prefixes from `seed * 25 + i`)."""
    num_actions = runner.model.preset.num_action_types
    short = synthetic(config.short_term, seed, num_actions)
    candidates = np.random.default_rng(seed + 1).integers(0, 2**40, config.candidates).tolist()
    return [
        (runner.build_sync(synthetic(length, seed * 25 + i, num_actions), False).wait(), short, candidates)
        for i in range(config.batch)
    ]


def measure_ranks(
    runner: ModelRunner, accelerator: Accelerator, config: AcceleratorBenchConfig
) -> list[dict]:
    """Cached rank P50/P99 per length; and a batch of `--batch` users against the same ranks one at a time."""
    ms, rows = timer(accelerator), []
    for length in listed(config, "lengths"):
        items = rank_items(runner, config, length, seed=4)
        for _ in range(3):
            runner.rank_sync(*items[0])
            runner.rank_batch_sync(items)
        alone = [ms(lambda i=items: runner.rank_sync(*i[0])) for _ in range(config.repeats)]
        batched = percentile(
            [ms(lambda i=items: runner.rank_batch_sync(i)) for _ in range(config.repeats)], 50
        )
        rows.append({
            "length": length, "rank_p50_ms": percentile(alone, 50), "rank_p99_ms": percentile(alone, 99),
            "batch": config.batch, "batch_p50_ms": batched, "batch_per_user_ms": batched / config.batch,
            "batch_speedup": percentile(alone, 50) * config.batch / batched,
        })  # fmt: skip
    return rows


def measure_graphs(
    runner: ModelRunner, accelerator: Accelerator, config: AcceleratorBenchConfig
) -> list[dict]:
    """Per length: the cached rank (one user, and `--batch` users) eager against replayed from a CUDA
    graph, with the ranker's default length buckets; the first graphed call of each shape is its capture.
    Off CUDA nothing is captured: the padded inputs run eagerly (`captured` false), which tests the path."""
    ms, rows = timer(accelerator), []
    buckets = RankerConfig().cuda_graph_bucket_list()
    graphs = RankGraphs(runner.model, accelerator, buckets, max_graphs=4 * len(buckets))
    graphed = ModelRunner(runner.model, runner.worker, config.chunk_tokens, None, runner.model_version,
                          accelerator, rank_batch_max=config.batch, graphs=graphs)  # fmt: skip
    for length in listed(config, "lengths"):
        items = rank_items(runner, config, length, seed=6)
        calls = {  # the eager and graphed ranks of one user and of the batch, timed in this order
            "eager": lambda i=items: runner.rank_sync(*i[0]),
            "graph": lambda i=items: graphed.rank_sync(*i[0]),
            "eager_batch": lambda i=items: runner.rank_batch_sync(i),
            "graph_batch": lambda i=items: graphed.rank_batch_sync(i),
        }
        capture_ms, batch_capture_ms = ms(calls["graph"]), ms(calls["graph_batch"])
        eager_scores = torch.tensor(runner.rank_batch_sync(items))
        graph_scores = torch.tensor(graphed.rank_batch_sync(items))
        for _ in range(3):
            for call in calls.values():
                call()
        eager, graph, eager_batch, graph_batch = (
            percentile([ms(call) for _ in range(config.repeats)], 50) for call in calls.values()
        )
        rows.append({
            "length": length, "bucket": next(b for b in buckets if b >= length), "captured": graphs.capture,
            "eager_p50_ms": eager, "graph_p50_ms": graph, "speedup": eager / graph, "batch": config.batch,
            "eager_batch_p50_ms": eager_batch, "graph_batch_p50_ms": graph_batch,
            "batch_speedup": eager_batch / graph_batch, "capture_ms": capture_ms,
            "batch_capture_ms": batch_capture_ms,
            "max_abs_vs_eager": float((graph_scores - eager_scores).abs().max()),
        })  # fmt: skip
    return rows


def device_name(device: torch.device) -> str:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "get_device_name"):
        return str(module.get_device_name(device))
    return "cpu"


def report(results: dict[str, Any]) -> str:
    lines = [
        f"# Accelerator path: {results['preset']} on {results['device_name']}",
        "",
        f"torch {results['torch']}, {results['short_term']} short-term events, {results['candidates']} "
        f"candidates, {results['repeats']} repetitions per point.",
        "",
        "## Cached rank against the full recomputation",
        "",
        "| prefix length | max abs Δ score |",
        "|---|---|",
        *(f"| {row['length']} | {row['max_abs']:.2e} |" for row in results["epsilon"]),
        "",
        "## DRAM → HBM reload",
        "",
    ]
    reload = results["reload"]
    lines += [
        f"{reload['bytes'] / 2**20:.1f} MiB ({reload['length']} tokens, {reload['layers']} layers): "
        f"{reload['reload_median_gb_s']:.1f} GB/s median against a pinned H2D peak of "
        f"{reload['pinned_h2d_peak_gb_s']:.1f} GB/s ({reload['fraction_of_peak']:.2f} of it), "
        f"{reload['reload_median_ms']:.2f} ms.",
        "",
        "## Cached rank latency",
        "",
        "| prefix length | P50 ms | P99 ms | batch | batch P50 ms | per user ms | batch speed-up |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['length']} | {r['rank_p50_ms']:.2f} | {r['rank_p99_ms']:.2f} | {r['batch']} | "
            f"{r['batch_p50_ms']:.2f} | {r['batch_per_user_ms']:.2f} | x{r['batch_speedup']:.2f} |"
            for r in results["ranks"]
        ),
        "",
    ]
    if results.get("graphs"):  # absent from runs before the CUDA graphs were measured
        captured = all(row["captured"] for row in results["graphs"])
        off_cuda = "" if captured else " (not captured off CUDA: padded, eager)"
        lines += [
            "## CUDA graphs of the cached rank" + off_cuda,
            "",
            "| prefix length | bucket | eager P50 ms | graph P50 ms | speed-up | batch | eager batch P50 ms "
            "| graph batch P50 ms | batch speed-up | capture ms (1 / batch) | max abs Δ vs eager |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {r['length']} | {r['bucket']} | {r['eager_p50_ms']:.2f} | {r['graph_p50_ms']:.2f} | "
                f"x{r['speedup']:.2f} | {r['batch']} | {r['eager_batch_p50_ms']:.2f} | "
                f"{r['graph_batch_p50_ms']:.2f} | x{r['batch_speedup']:.2f} | "
                f"{r['capture_ms']:.0f} / {r['batch_capture_ms']:.0f} | {r['max_abs_vs_eager']:.2e} |"
                for r in results["graphs"]
            ),
            "",
        ]
    return "\n".join(lines)


def run(config: AcceleratorBenchConfig) -> dict[str, Any]:
    device = select_device(config.device)
    preset = get_preset(config.model_preset)
    accelerator = Accelerator(device, copies=True)
    scheduler = Scheduler("bench-device")
    model = HSTURanker(preset).to(device)
    runner = ModelRunner(model, scheduler, config.chunk_tokens, None, model.version, accelerator,
                         rank_batch_max=config.batch)  # fmt: skip
    try:
        results = {
            "preset": preset.name, "device": str(device), "device_name": device_name(device),
            "torch": torch.__version__, "short_term": config.short_term, "candidates": config.candidates,
            "repeats": config.repeats, "epsilon": measure_epsilon(runner, config),
            "reload": measure_reload(runner, accelerator, config),
            "ranks": measure_ranks(runner, accelerator, config),
            "graphs": measure_graphs(runner, accelerator, config),
        }  # fmt: skip
    finally:
        scheduler.close()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = dataclasses.asdict(config)
    envelope.write(out / "results.json", "accelerator", results, settings=settings, **context.provenance())
    (out / "report.md").write_text(report(results))
    return results
