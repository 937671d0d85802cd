"""`python -m services.loadgen --config deploy/loadtest/<x>.json`: run a ghz config open-loop, print ghz JSON.

Run it from the repository root: the config's paths are taken from the working directory, as ghz takes
them. The report goes to `--output` (or standard output); a one-line summary goes to standard error.
Ctrl-C stops sending, waits for the requests in flight and still writes the report (endReason "cancel").
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import itertools
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from services.common.config import MAX_MESSAGE_BYTES, load, setting
from services.loadgen.ghz_config import GhzConfig, load_ghz_config
from services.loadgen.openloop import run_open_loop
from services.loadgen.report import ghz_report


@dataclasses.dataclass(frozen=True)
class LoadgenConfig:
    config: str = setting(
        "", "ghz config file (JSON) describing the load test; its paths are taken from the working directory"
    )
    target: str = setting("", "host:port to load, overriding the config's host")
    output: str = setting("", "file for the JSON report (empty: standard output)")
    arrival_seed: int = setting(-1, "seed of the Poisson arrival times (-1: a fresh one each run)")

    def validate(self) -> None:
        if not self.config:
            raise ValueError("--config is required")


def channel_options(ghz: GhzConfig) -> list[tuple[str, Any]]:
    """The options of each of the run's channels: message limits, a connection of its own (as ghz's
    `connections`) and the config's `lb-strategy`, if any."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.use_local_subchannel_pool", 1),  # one connection per channel, as ghz's `connections`
    ]
    if ghz.lb_strategy:
        options.append(("grpc.lb_policy_name", ghz.lb_strategy))
    return options


def open_channel(ghz: GhzConfig, target: str) -> grpc.aio.Channel:
    options = channel_options(ghz)
    if ghz.insecure:
        return grpc.aio.insecure_channel(target, options=options)
    files = {key: path.read_bytes() for key, path in ghz.paths.items() if key in ("cacert", "key", "cert")}
    credentials = grpc.ssl_channel_credentials(
        root_certificates=files.get("cacert"),
        private_key=files.get("key"),
        certificate_chain=files.get("cert"),
    )
    return grpc.aio.secure_channel(target, credentials, options=options)


async def run(config: LoadgenConfig) -> dict[str, Any]:
    ghz = load_ghz_config(config.config)
    channels = [open_channel(ghz, config.target or ghz.host) for _ in range(ghz.connections)]
    calls = itertools.cycle(
        [
            channel.unary_unary(
                ghz.method.path,
                request_serializer=ghz.method.request_class.SerializeToString,
                response_deserializer=ghz.method.response_class.FromString,
            )
            for channel in channels
        ]
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    started_at = datetime.datetime.now(datetime.UTC)
    began = time.perf_counter()
    try:
        records = await run_open_loop(
            lambda request, **kwargs: next(calls)(request, **kwargs),
            ghz.requests,
            ghz.schedule,
            duration_s=ghz.duration_s,
            total=ghz.total,
            timeout_s=ghz.timeout_s or None,  # ghz: a zero timeout means none
            metadata=ghz.metadata,
            seed=None if config.arrival_seed < 0 else config.arrival_seed,
            stop=stop,
        )
    finally:
        for channel in channels:
            await channel.close()
    options = {**ghz.options, "host": config.target or ghz.host}
    reason = end_reason(ghz, len(records), stop.is_set())
    elapsed_s = time.perf_counter() - began
    return ghz_report(records, elapsed_s, started_at, options, reason, ghz.skip_first, ghz.name, ghz.tags)


def end_reason(ghz: GhzConfig, sent: int, cancelled: bool) -> str:
    """ghz's endReason: cancel (Ctrl-C), timeout (the duration ran out first) or normal (total sent)."""
    if cancelled:
        return "cancel"
    if ghz.total is not None and sent >= ghz.total:
        return "normal"
    return "timeout"


def summary(report: dict[str, Any]) -> str:
    distribution = report["latencyDistribution"] or []
    percentiles = {entry["percentage"]: entry["latency"] / 1e6 for entry in distribution}
    errors = sum(report["errorDistribution"].values())
    return (
        f"{report['count']} requests in {report['total'] / 1e9:.1f}s ({report['rps']:.1f}/s), "
        f"P50 {percentiles.get(50, 0):.2f} ms, P99 {percentiles.get(99, 0):.2f} ms, {errors} errors"
    )


def main(argv: Sequence[str] | None = None) -> None:
    config = load(
        LoadgenConfig,
        argv,
        prog="python -m services.loadgen",
        description="Open-loop (Poisson) gRPC load generator: reads ghz configs, writes ghz JSON reports.",
    )
    try:
        report = asyncio.run(run(config))
    except (ValueError, OSError) as exc:
        sys.exit(f"loadgen: {exc}")
    text = json.dumps(report, indent=2)
    if config.output:
        Path(config.output).write_text(text + "\n")
    else:
        print(text)
    print(summary(report), file=sys.stderr)


if __name__ == "__main__":
    main()
