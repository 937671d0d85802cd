"""`python -m services.ranker`: one ranker — the model on one device, its prefix-KV tiers, RankerService."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from pathlib import Path

from relaygr.v1 import ranker_pb2_grpc
from services.common import config as config_lib
from services.common.server import GrpcServer, run, setup_logging
from services.ranker.config import RankerConfig
from services.ranker.device import TierCopier, select_device
from services.ranker.engine import DeviceWorker, Priority
from services.ranker.model import HSTURanker
from services.ranker.prefix_cache import PrefixCache
from services.ranker.presets import get_preset
from services.ranker.profile import measure
from services.ranker.runner import ModelRunner
from services.ranker.servicer import RankerServicer
from services.ranker.tiers import POLICIES, Tier

log = logging.getLogger("services.ranker")
SERVICE_NAME = "relaygr.v1.RankerService"
MIB = 1024 * 1024


def build_model(config: RankerConfig):
    """The model on its device and its version (the preset's, plus the checkpoint's digest if any)."""
    import torch

    preset = get_preset(config.model_preset)
    device = select_device(config.device)
    if config.checkpoint:
        model = HSTURanker.from_checkpoint(preset, config.checkpoint)
        digest = hashlib.sha256(Path(config.checkpoint).read_bytes()).hexdigest()[:12]
        version = f"{preset.version}-ckpt-{digest}"
    else:
        model = HSTURanker(preset)
        version = preset.version
    model = model.to(device=device, dtype=preset.dtype).eval()
    dram_dtype = torch.bfloat16 if config.dram_lossy_bf16 else preset.dtype
    return model, version, device, dram_dtype


async def serve(config: RankerConfig) -> None:
    model, version, device, dram_dtype = build_model(config)
    worker = DeviceWorker("device")
    copy_worker = DeviceWorker("copy")
    runner = ModelRunner(
        model, worker, config.pre_infer_chunk_tokens, config.candidate_microbatch or None, version
    )
    cache = PrefixCache(
        runner,
        TierCopier(device, model.preset.dtype, dram_dtype),
        copy_worker,
        Tier("hbm", int(config.hbm_budget_mb * MIB)),
        Tier("dram", int(config.dram_budget_mb * MIB), POLICIES[config.dram_policy]()),
        lease_ttl_s=config.lease_ttl_ms / 1000,
        dram_ttl_s=config.dram_ttl_s,
        instance=config.instance_name,
        max_pending_pre_infer=config.max_pending_pre_infer,
    )

    async def drain() -> None:
        """Stops new pre-inference, then lets leased entries be consumed or expire within the grace."""
        cache.accepting = False
        loop = asyncio.get_running_loop()
        until = loop.time() + config.drain_grace_s / 2
        while cache.leased() and loop.time() < until:
            cache.sweep()
            await asyncio.sleep(0.05)

    servicer = RankerServicer(config, runner, cache, str(device))
    server = GrpcServer(
        config,
        SERVICE_NAME,
        lambda s: ranker_pb2_grpc.add_RankerServiceServicer_to_server(servicer, s),
        drain,
    )
    await server.start()
    server.install_signal_handlers()
    log.info("warming up %s on %s (model %s)", config.model_preset, device, version)
    curve = await worker.submit(
        lambda: measure(
            runner,
            config.profile_length_list(),
            config.profile_short_term,
            config.profile_candidates,
            config.profile_repeats,
        ),
        Priority.RANK,
        "profile",
    )
    servicer.curve = curve
    for point in curve.points:
        log.info(
            "profile L=%d: full %.2f ms, pre-infer %.2f ms, rank %.2f ms",
            point.prefix_length, point.full_ms, point.pre_infer_ms, point.rank_ms,
        )  # fmt: skip

    async def sweep_forever() -> None:
        while True:
            await asyncio.sleep(0.1)
            cache.sweep()

    sweeper = asyncio.create_task(sweep_forever())
    await server.set_serving()
    try:
        await server.wait()
    finally:
        sweeper.cancel()
        await cache.close()
        worker.close()
        copy_worker.close()


def main(argv: list[str] | None = None) -> None:
    config = config_lib.load(
        RankerConfig, argv, prog="python -m services.ranker", description="RelayGR ranker: " + __doc__
    )
    setup_logging(config.log_level, f"ranker[{config.instance_name}]")
    run(lambda: serve(config))


if __name__ == "__main__":
    main(sys.argv[1:])
