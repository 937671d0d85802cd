"""Assembles a ranker from its settings: model, device threads, tiers, prefix cache, servicer, server.

`RankerApp` is what `python -m services.ranker` runs (`services.common.server.serve_app`), and what tests
build in-process to exercise the same components without a subprocess.
"""

from __future__ import annotations

import asyncio
import logging

import torch

from relaygr.v1 import common_pb2, ranker_pb2
from services.affinity.membership import Membership
from services.common.contract import RANKER_SERVICE
from services.common.cpus import cpu_budget
from services.common.metrics import enum_labels, precreate
from services.common.server import GrpcServer
from services.ranker import metrics
from services.ranker.budgets import parameter_bytes, resolve_budgets
from services.ranker.cache.acquired import Source
from services.ranker.cache.admission import Admission
from services.ranker.cache.prefix_cache import Kind, PrefixCache
from services.ranker.cache.tiers import POLICIES, Tier
from services.ranker.config import RankerConfig
from services.ranker.dataplane import DataPlane
from services.ranker.device.accelerator import Accelerator, select_device
from services.ranker.device.copier import TierCopier
from services.ranker.device.graphs import RankGraphs
from services.ranker.device.host_pool import HostPool
from services.ranker.engine.calibration import Calibration
from services.ranker.engine.latency_curve import LatencyCurve
from services.ranker.engine.load import LoadBook
from services.ranker.engine.recheck import Recheck
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Op, Scheduler
from services.ranker.handoff import servicer as handoff
from services.ranker.handoff.auth import Gate
from services.ranker.handoff.peers import Peers
from services.ranker.handoff.push import SENT_OUTCOMES, HandoffSummary, Pusher
from services.ranker.handoff.read_through import READ_THROUGH_OUTCOMES, ReadThrough
from services.ranker.handoff.receive import RECEIVED
from services.ranker.model import kv_precision
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset
from services.ranker.model.store import is_model_dir, load_model_dir
from services.ranker.servicer import RankerServicer, add_to_server

log = logging.getLogger("services.ranker")
MIB = 1024 * 1024


def build_model(config: RankerConfig) -> tuple[HSTURanker, str, torch.device]:
    """The model on its device, and its version (the config's, plus the checkpoint's digest if any).

    `--checkpoint DIR` (a model directory, `model/store.py`) brings its own architecture (`--model-preset` is
    not read); `--checkpoint FILE` is a state_dict of the preset's model."""
    device = select_device(config.device)
    set_torch_threads(config.torch_threads)
    if config.checkpoint and is_model_dir(config.checkpoint):
        model = load_model_dir(config.checkpoint)
    elif config.checkpoint:
        model = HSTURanker.from_checkpoint(get_preset(config.model_preset), config.checkpoint)
    else:
        model = HSTURanker(get_preset(config.model_preset))
    return model.to(device=device, dtype=model.preset.dtype).eval(), model.version, device


def set_torch_threads(flag: int) -> int:
    """Sizes torch's intra-op pool: `flag` (--torch-threads) when given, else the process's CPU budget
    (the fewer of its affinity and its cgroup quota, `services.common.cpus`); logged and exported."""
    if flag > 0:
        threads, source, why = flag, "flag", f"{flag} (--torch-threads)"
    else:
        budget = cpu_budget()
        threads, source, why = budget.cpus, budget.source, budget.describe()
    torch.set_num_threads(threads)
    log.info("torch intra-op threads: %s", why)
    metrics.TORCH_THREADS.clear()
    metrics.TORCH_THREADS.labels(source).set(threads)
    return threads


def precreate_metrics() -> None:
    sources = [(source.label,) for source in Source]
    precreate(metrics.RANK_REQUESTS, *sources)
    precreate(metrics.RANK_LATENCY, *sources)
    precreate(metrics.RANK_LOSSY, *sources)
    precreate(metrics.RANK_MISSES, *enum_labels(common_pb2.MissReason))
    precreate(metrics.PRE_INFER_OUTCOMES, *enum_labels(ranker_pb2.PreInferOutcome))
    precreate(metrics.PRE_INFER_TOKENS, ("consumed",), ("wasted",))
    precreate(metrics.PRODUCTIONS, *[(kind.value,) for kind in Kind])
    precreate(metrics.MODEL_SECONDS, *[(op.value,) for op in Op])
    precreate(metrics.HANDOFF_SENT_ENTRIES, *[(outcome,) for outcome in SENT_OUTCOMES])
    precreate(metrics.HANDOFF_RECEIVED_ENTRIES, ("admitted",), ("torn",), *[(label,) for label in RECEIVED])
    precreate(metrics.READ_THROUGH, *[(outcome,) for outcome in READ_THROUGH_OUTCOMES])


class RankerApp:
    """One ranker's components. Build inside a running event loop; `close()` stops the threads."""

    # What runs the model's passes (a benchmark measures the serving path with a runner of free passes).
    runner_class: type[ModelRunner] = ModelRunner

    def __init__(self, config: RankerConfig, accelerator: Accelerator | None = None) -> None:
        """`accelerator` replaces the device's own (tests pass `Accelerator(cpu, copies=True)` to run the
        pinned-pool copy path on CPU)."""
        self.config = config
        precreate_metrics()
        model, version, self.device = build_model(config)
        self.budgets = resolve_budgets(config, self.device, parameter_bytes(model))
        # The latency curve, corrected by what the device thread's jobs take (the load book reads it).
        self.calibration = Calibration()
        self.worker = Scheduler("device", metrics.DEVICE_QUEUE_DEPTH, self.calibration.observe)
        self.copy_worker = Scheduler("copy")
        # The device's streams (rank, pre-infer, copy) and events; synchronous stand-ins on CPU.
        self.accelerator = accelerator or Accelerator(self.device)
        self.runner = self.runner_class(
            model,
            self.worker,
            config.pre_infer_chunk_tokens,
            config.candidate_microbatch or None,
            version,
            accelerator=self.accelerator,
            inflight_chunks=config.pre_infer_inflight_chunks,
            rank_batch_max=config.rank_batch_max,
            graphs=self._graphs(model),
        )
        dram_dtype = kv_precision.dram_dtype(config.dram_precision, model.preset.dtype)
        self.cache = PrefixCache(
            self.runner,
            TierCopier(self.accelerator, model.preset.dtype, dram_dtype, self._host_pool()),
            self.copy_worker,
            Tier("hbm", self.budgets.hbm_bytes),
            Tier("dram", self.budgets.dram_bytes, POLICIES[config.dram_policy]()),
            lease_ttl_s=config.lease_ttl_ms / 1000,
            dram_ttl_s=config.dram_ttl_s,
            instance=config.instance_name,
            max_pending_pre_infer=config.max_pending_pre_infer,
            load=LoadBook(self.worker, calibration=self.calibration),
            max_pre_infer_backlog_ms=config.max_pre_infer_backlog_ms,
            max_tombstones=config.max_tombstones,
        )
        self.plane = DataPlane(config, self.runner, self.cache, self.worker)
        self.servicer = RankerServicer(config, self.plane, str(self.device))
        # Prefixes that outlive this ranker's membership: taken from peers, handed to them on a drain.
        self.admission = Admission(
            self.cache,
            config.max_long_term_events,
            model.preset.num_action_types,
            staging_bytes=int(config.handoff_staging_mb * MIB),
        )
        self.handoff = handoff.HandoffServicer(
            self.admission, config.instance_name, Gate(config), config.handoff_chunk_timeout_s
        )
        self.peers: Peers | None = None
        self.read_through: ReadThrough | None = None
        if config.routes_directly:  # the ring is known (--rankers or --rankers-srv)
            self.peers = Peers(Membership.from_config(config, config), config.instance_name)
            if config.reads_through:
                self.read_through = ReadThrough(self.admission, self.peers, config, self.cache.load)
                self.cache.read_through = self.read_through
        self.handed_off: HandoffSummary | None = None
        metrics.HANDOFF_BUDGET.set(config.handoff_budget_s if self.peers is not None else 0.0)
        self.grpc = self._server()
        self._sweeper: asyncio.Task | None = None
        self.recheck: Recheck | None = None
        self._recheck_task: asyncio.Task | None = None
        metrics.CURVE_PROVISIONAL.set_function(lambda: float(self.calibration.provisional))

    async def start(self) -> None:
        """Binds the ports (health NOT_SERVING), warms up, then turns SERVING."""
        await self.grpc.start()
        if self.peers is not None:
            await self.peers.membership.start()
        preset, version = self.runner.model.preset.name, self.runner.model_version
        log.info("warming up %s on %s (model %s)", preset, self.device, version)
        await self.warm_up()
        await self.grpc.set_serving()

    def _graphs(self, model: HSTURanker) -> RankGraphs | None:
        """CUDA graphs of the cached rank, when asked for (`--cuda-graphs`, CUDA devices only)."""
        if not self.config.cuda_graphs:
            return None
        if self.device.type != "cuda":
            raise ValueError(f"--cuda-graphs needs a CUDA device; this ranker runs on {self.device}")
        buckets = self.config.cuda_graph_bucket_list()
        return RankGraphs(model, self.accelerator, buckets, self.config.cuda_graph_max)

    def _host_pool(self) -> HostPool | None:
        """The DRAM tier's memory when tier moves copy: one arena of the DRAM budget, allocated (and pinned,
        on an accelerator) once, here."""
        if not self.accelerator.copies:
            return None
        capacity = self.budgets.dram_bytes
        return HostPool(capacity, self.accelerator.pinned(capacity))

    async def warm_up(self) -> LatencyCurve:
        """Measures the data plane's latency curve, then starts the cache's sweeper, and, when the curve is
        provisional (measured disturbed), its recheck in the background."""
        curve = await self.plane.warm_up()
        for point in curve.points:
            log.info(
                "profile L=%d: full %.2f ms, pre-infer %.2f ms, rank %.2f ms",
                point.prefix_length, point.full_ms, point.pre_infer_ms, point.rank_ms,
            )  # fmt: skip
        loop = asyncio.get_running_loop()
        self._sweeper = loop.create_task(self._sweep_forever())
        if curve.provisional:
            log.warning(
                "latency curve provisional: its warm-up ran disturbed (wall time over %.1fx the device "
                "thread's CPU time) in every round; measuring it again once the device is idle",
                self.config.profile_disturbed_ratio,
            )
            self.recheck = Recheck(
                self.worker,
                self.plane.timer(),
                curve,
                self.calibration.set_curve,
                self.config.profile_recheck_s,
            )
            self._recheck_task = loop.create_task(self.recheck.run())
        return curve

    async def _sweep_forever(self) -> None:
        """Releases expired leases and idle DRAM entries even when no request arrives: it wakes when the
        soonest of them is due (at most every --sweep-interval-ms), not on a fixed tick, so an idle ranker
        sleeps (a tick every 50 ms cost an idle ranker 5 ms of CPU a second)."""
        interval = self.config.sweep_interval_ms / 1000
        while True:
            await asyncio.sleep(max(interval, self.cache.next_sweep_in()))
            self.cache.sweep()

    async def drain(self) -> None:
        """Refuses new pre-inference and keeps serving Ranks for `drain_min_s` (until routers have seen
        NOT_SERVING), and on while leased entries await their Ranks, up to half the grace; knowing its peers,
        it hands its cached prefixes to their next owners meanwhile, and what the drain made once it is over
        (within `--handoff-budget-s` from its start); the server's stop then gives in-flight RPCs the
        grace."""
        self.cache.accepting = False
        pusher = None
        if self.peers is not None and self.config.hands_off:
            pusher = Pusher(self.admission, self.peers, self.config)
            pushing = asyncio.create_task(pusher.push())  # under way while the routers move the users
        loop = asyncio.get_running_loop()
        started = loop.time()
        at_least = started + self.config.drain_min_s
        at_most = started + max(self.config.drain_min_s, self.config.drain_grace_s / 2)
        while loop.time() < at_least or (self.cache.leased() and loop.time() < at_most):
            await asyncio.sleep(self.config.sweep_interval_ms / 1000)
        if pusher is not None:
            await pushing
            self.handed_off = await pusher.push()  # and what the drain's last Ranks made

    def _server(self) -> GrpcServer:
        return GrpcServer(
            self.config,
            RANKER_SERVICE,
            lambda s: (add_to_server(self.servicer, s), handoff.add_to_server(self.handoff, s)),
            self.drain,
        )

    async def close(self) -> None:
        for task in (self._sweeper, self._recheck_task):
            if task is not None:
                task.cancel()
        if self.read_through is not None:
            await self.read_through.close()
        if self.peers is not None:
            await self.peers.membership.close()
        await self.cache.close()
        self.worker.close()
        self.copy_worker.close()
