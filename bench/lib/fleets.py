"""The fleets the benchmark compares: the baseline, RelayGR, and RelayGR with one technique taken away.

Every mode runs the same launcher (`services.launcher.Fleet`: rankers, router, trigger, retrieval stub as
separate processes on loopback) with the same model preset, rankers and ranker flags; only what the mode
names differs (`Mode`, each described where it is declared). `Mode.fleet` is what a mode's processes are
started with; modes with equal ones share a fleet (`no-revisit`, a workload variant, runs on RelayGR's).
The trigger and the stubs route their own PreInfer and Rank calls (the launcher's `--routing direct`), so
the router takes no part in a measured request.

`BenchFleet` also serves other user universes, relay windows and abandonment shares than its own stub's,
from one extra retrieval stub (replaced whenever another is asked for) wired like the fleet's own.
`FleetSettings` declares, once, the settings of the fleets a bench command starts (`bench.mlperf`,
`bench.tracing`), with the services' flag names; a command redeclares a default where its own differs.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from bench.lib.workload import Universe
from services.common.config import setting
from services.common.contract import RECOMMEND_SERVICE
from services.common.presets import MODEL_PRESET_NAMES
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet, FleetConfig
from services.launcher.procs import Processes, ServiceProcess


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    description: str
    relay: bool = True  # the stub sends Admit and the relay hint
    dram: bool = True  # the rankers keep a DRAM tier
    router_args: str = ""  # flags of every routing process: the router, the trigger and the stubs
    trigger_args: str = ""
    revisits: bool = True  # False: a workload variant where no request revisits a user

    @property
    def fleet(self) -> tuple[bool, bool, str, str]:
        """What the mode's processes are started with: modes with equal ones can share a fleet."""
        return self.relay, self.dram, self.router_args, self.trigger_args


BASELINE = Mode(
    "baseline", "no Admit, no hint, no DRAM tier: every Rank computes the whole sequence", False, False
)
RELAY = Mode("relay", "RelayGR: trigger, affinity router with relay hints, HBM and DRAM tiers")
ABLATIONS = (
    Mode(
        "admit-all",
        "RelayGR whose trigger admits every request (--admit-all): no selectivity, no brakes",
        trigger_args="--admit-all true",
    ),
    Mode(
        "dram-only",
        "no Admit and no hint, but the rankers keep their DRAM tier: the expander's share without relay",
        relay=False,
    ),
    Mode(
        "no-affinity",
        "RelayGR with random routing of PreInfer and Rank",
        router_args="--routing-policy random",
    ),
    Mode("no-dram", "RelayGR without the DRAM tier", dram=False),
    Mode(
        "no-revisit",
        "RelayGR's fleet on the same mix with revisit probability 0: neither DRAM nor extension can help",
        revisits=False,
    ),
)


RELAY_WINDOW_HELP = "the relay window: the stub's pre-processing time, the trigger's placement window"


@dataclasses.dataclass(frozen=True)
class FleetSettings:
    """The settings of the fleets a bench command starts, each a flag with a `RELAYGR_…` twin."""

    model_preset: str = setting("cpu-small", "every ranker's model preset", choices=MODEL_PRESET_NAMES)
    rankers: int = setting(2, "rankers per fleet", above=0)
    torch_threads: int = setting(1, "intra-op threads per ranker", above=0)
    relay_window_ms: float = setting(100.0, RELAY_WINDOW_HELP, minimum=0)
    hbm_budget_mb: float = setting(256.0, "HBM tier per ranker, MiB", above=0)
    dram_budget_mb: float = setting(1024.0, "DRAM tier per ranker, MiB (the baseline keeps none)", minimum=0)
    startup_timeout_s: float = setting(300.0, "seconds each service gets to become healthy", above=0)


@dataclasses.dataclass(frozen=True)
class WorkloadSettings:
    """The users a fleet's retrieval stub serves (the lognormal mix of their histories, their revisits) and
    its Rank deadline, each a flag with a `RELAYGR_…` twin."""

    mix_median: int = setting(1024, "median long-term length of the users' lognormal mix", above=0)
    mix_sigma: float = setting(0.75, "sigma of the log length of the mix", above=0)
    mix_max: int = setting(2048, "longest long-term history of the mix (a cap, as production has)", above=0)
    short_term: int = setting(16, "short-term events per request", above=0)
    universe_seed: int = setting(0, "seed of the user universe (the same in every mode)")
    revisit_probability: float = setting(
        0.5, "share of requests from a user seen within --revisit-window-s", minimum=0, below=1
    )
    revisit_window_s: float = setting(
        5.0, "a revisit repeats the user of a request of the last this many s", above=0
    )
    rank_timeout_ms: float = setting(1000.0, "the stub's Rank deadline (a missed one is an error)", above=0)

    def validate(self) -> None:
        if self.mix_median >= self.mix_max:
            raise ValueError("--mix-median must be below --mix-max")


@dataclasses.dataclass(frozen=True)
class FleetShape:
    """What every mode's fleet shares."""

    rankers: int
    model_preset: str
    hbm_budget_mb: float
    dram_budget_mb: float
    slo_ms: float
    ranker_args: str  # beyond the ones every mode needs (e.g. --torch-threads)
    max_long_term: int  # the longest long-term history any universe of the run serves
    stub_args: str  # flags of every retrieval stub (deadlines, log level)
    startup_timeout_s: float


class BenchFleet:
    """One mode's fleet and the retrieval stub under test. Use as a context manager; stops everything."""

    def __init__(
        self,
        mode: Mode,
        shape: FleetShape,
        universe: Universe,
        delay_ms: float,
        log_dir: Path,
        routing: str = "direct",
    ) -> None:
        self.mode = mode
        self.shape = shape
        limit = f"--max-long-term-events {shape.max_long_term}"
        self.config = FleetConfig(
            rankers=shape.rankers,
            model_preset=shape.model_preset,
            hbm_budget_mb=shape.hbm_budget_mb,
            dram_budget_mb=shape.dram_budget_mb if mode.dram else 0.0,
            slo_ms=shape.slo_ms,
            relay=mode.relay,
            routing=routing,
            base_port=0,
            metrics_base_port=0,
            log_dir=str(log_dir),
            startup_timeout_s=shape.startup_timeout_s,
            ranker_args=f"{shape.ranker_args} {limit}",
            router_args=mode.router_args,
            # The trigger places prefixes by the fleet's own window (other stubs' windows share it); a mode's
            # own flags come after, so they win.
            trigger_args=f"--relay-window-ms {delay_ms:g} {mode.trigger_args} {mode.router_args} {limit}",
            stub_args=shlex.join(self._stub_flags(universe, delay_ms, 0.0)),
        )
        self.fleet = Fleet(self.config)
        self._own = (universe, delay_ms, 0.0)
        self._extra_processes = Processes(log_dir=log_dir)
        self._extra: tuple[tuple[Universe, float, float], ServiceProcess] | None = None

    def _stub_flags(self, universe: Universe, delay_ms: float, abandon_fraction: float) -> list[str]:
        # Admit runs during pre-processing, so it may take the whole window without delaying the Rank;
        # without a window (0) the stub's own Admit deadline applies.
        admit_timeout = ["--admit-timeout-ms", str(delay_ms)] if delay_ms > 0 else []
        return [
            *shlex.split(self.shape.stub_args), "--relay-window-ms", str(delay_ms), *admit_timeout,
            "--abandon-fraction", str(abandon_fraction), *universe.stub_args,
            *shlex.split(self.mode.router_args),
        ]  # fmt: skip

    def __enter__(self) -> BenchFleet:
        self.fleet.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._extra_processes.close()
        self.fleet.stop()

    def stub(self, universe: Universe, delay_ms: float, abandon_fraction: float = 0.0) -> str:
        """The address of a retrieval stub serving `universe` with relay window `delay_ms`, abandoning
        `abandon_fraction` of its requests after retrieval."""
        self.fleet.check()
        wanted = (universe, delay_ms, abandon_fraction)
        if wanted == self._own:
            return self.fleet.address(STUB)
        if self._extra is not None and self._extra[0] == wanted:
            return self._extra[1].address
        self._extra_processes.close()
        args = [
            *self.fleet.ranker_route_args(), "--trigger", self.fleet.address(TRIGGER),
            "--relay", str(self.mode.relay).lower(), *self._stub_flags(*wanted),
        ]  # fmt: skip
        name = f"{STUB}-{universe.label}-d{delay_ms:g}-a{abandon_fraction:g}"
        child = self._extra_processes.start(name, "services.retrieval_stub", RECOMMEND_SERVICE, args)
        child.wait_healthy(self.shape.startup_timeout_s)
        self._extra = (wanted, child)
        return child.address

    def router(self) -> str:
        return self.fleet.address(ROUTER)

    def pids(self) -> dict[str, int]:
        """Every running process of the fleet, the extra stub included, by name."""
        pids = {name: endpoint.pid for name, endpoint in self.fleet.endpoints().items()}
        if self._extra is not None:
            pids[self._extra[1].name] = self._extra[1].popen.pid
        return pids

    def ranker_metrics(self) -> dict[str, str]:
        endpoints = self.fleet.endpoints()
        return {name: endpoints[name].metrics_url for name in self.fleet.ranker_names}
