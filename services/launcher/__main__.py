"""`python -m services.launcher` (`make run`): the whole fleet on this machine, with demo traffic.

Starts the rankers, the router, the trigger and the retrieval stub, waits until each is healthy, prints
where they answer, drives demo Recommend traffic with a live progress line (misses split by reason), and
serves until Ctrl-C or SIGTERM (or `--duration-s`), then says what the relay saved (the time it took off
the cached Ranks, by the rankers' measured latency curve) and stops every child. A child that dies is
named with its log tail, the others are stopped and the launcher exits with status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO

from services.common.config import load
from services.launcher.demo import DemoProgress, LauncherConfig, drive_demo, fetch_rank_costs
from services.launcher.fleet import ROUTER, STUB, Endpoint, Fleet, ServiceExited

CHECK_INTERVAL_S = 0.5
PROGRESS_INTERVAL_S = 1.0


def endpoint_table(endpoints: dict[str, Endpoint]) -> str:
    rows = [("service", "gRPC", "metrics", "pid")]
    rows += [(e.name, e.address, e.metrics_url, str(e.pid)) for e in endpoints.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


class ProgressLine:
    """Rewrites one terminal line in place; writes one line per update when not on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()

    def show(self, text: str) -> None:
        self.out.write(f"\r{text}\x1b[K" if self.tty else text + "\n")
        self.out.flush()

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


async def serve_demo(fleet: Fleet, config: LauncherConfig, out: TextIO) -> None:
    """Drives demo traffic until it ends or a signal arrives; raises ServiceExited if a child dies."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The rankers' latency curve, for the closing summary's time saved (a router answers as a ranker).
    costs = await fetch_rank_costs(fleet.address(ROUTER), config.client_tls())
    progress = DemoProgress(config.progress_window_s, costs=costs)
    display = ProgressLine(out)
    crashes: list[ServiceExited] = []

    async def every(interval_s: float, action: Callable[[], None]) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            action()

    def check() -> None:
        try:
            fleet.check()
        except ServiceExited as exc:
            crashes.append(exc)
            stop.set()

    background = [
        asyncio.create_task(every(CHECK_INTERVAL_S, check)),
        asyncio.create_task(every(PROGRESS_INTERVAL_S, lambda: display.show(progress.line()))),
    ]
    try:
        await drive_demo(fleet.address(STUB), config, progress, stop)
    finally:
        stop.set()
        await asyncio.gather(*background)
        display.finish()
    if crashes:
        raise crashes[0]
    if progress.total:
        out.write(progress.summary() + "\n")
        out.flush()


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    config = load(
        LauncherConfig,
        argv,
        prog="python -m services.launcher",
        description="Start the local RelayGR fleet, drive demo traffic, stop everything on Ctrl-C.",
    )
    # SIGTERM while starting must unwind through the Fleet's `with` like Ctrl-C, or children would be left.
    signal.signal(signal.SIGTERM, _interrupt)
    status = 0
    fleet = Fleet(config)
    try:
        relay = "on" if config.relay else "off: baseline"
        print(
            f"starting {config.rankers} rankers ({config.model_preset}), router, trigger, retrieval stub "
            f"(relay {relay}); logs in {config.log_dir}/",
            flush=True,
        )
        with fleet:
            print(endpoint_table(fleet.endpoints()), flush=True)
            print("demo traffic running; Ctrl-C stops every service", flush=True)
            try:
                asyncio.run(serve_demo(fleet, config, sys.stdout))
            finally:
                # Stopping is bounded (SIGTERM, then SIGKILL after a grace): let it finish undisturbed.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ServiceExited as exc:
        print(f"\nlauncher: {exc}\nstopped the other services.", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        print(f"\nlauncher: {exc}\nstopped every service.", file=sys.stderr)
        status = 1
    print("fleet stopped.", flush=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
