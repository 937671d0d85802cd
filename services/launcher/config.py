"""The local fleet's settings (`FleetConfig`), and its services' names and ports: what
`services.launcher.fleet` runs."""

from __future__ import annotations

import dataclasses
import shlex

from services.common.config import ServiceConfig, check, setting
from services.common.presets import MODEL_PRESET_NAMES

# Health-checked service names; the router serves RankerService like a ranker.

ROUTER, TRIGGER, STUB = "router", "trigger", "retrieval-stub"
ROUTINGS = ("direct", "router")
PORT_OFFSETS = {ROUTER: 0, TRIGGER: 2, STUB: 3}
RANKER_PORT_OFFSET = 10


@dataclasses.dataclass(frozen=True)
class FleetConfig:
    """What the local fleet runs; each extra-args string is split like a shell command line.

    The fleet passes a service only the flags it sets: a setting left unset (None; `(empty)` in
    docs/configuration.md) is not passed on, so the service's own default applies, and no service's
    configuration is imported here to copy it."""

    rankers: int = setting(2, "number of rankers (named ranker-0 … ranker-N-1)")
    spare_rankers: int = setting(
        0,
        "rankers declared as ring members after --rankers (ranker-N …) but not started: every --rankers list "
        "names them, so until one is started (a scale-out) its users go to their next member",
        minimum=0,
    )
    rankers_per_device: int = setting(
        1,
        "rankers that share each accelerator (K): ranker i runs on the (i // K)th of --devices, with 1/K of "
        "the auto HBM and DRAM budgets (its --device-sharers)",
        above=0,
    )
    devices: str = setting(
        "",
        "the accelerators the rankers run on, comma-separated (e.g. cuda:0,cuda:1), --rankers-per-device "
        "rankers each (empty: every ranker on its own --device)",
    )
    model_preset: str = setting("cpu-small", "every ranker's model preset", choices=MODEL_PRESET_NAMES)
    checkpoint: str | None = setting(
        None,
        "model every ranker serves: a model directory (e.g. from services.ranker.convert; its architecture "
        "replaces --model-preset) or a state_dict file (unset: seeded weights)",
    )
    hbm_budget_mb: float | None = setting(
        None,
        "HBM-tier byte budget of each ranker, MiB (-1: the ranker's auto one; unset: the ranker's default)",
    )
    dram_budget_mb: float | None = setting(
        None,
        "DRAM-tier byte budget of each ranker, MiB (-1: the ranker's auto one; unset: the ranker's default)",
    )
    slo_ms: float | None = setting(
        None,
        "the trigger's ranking latency SLO (P99), ms: it never sheds what would miss it (unset: the "
        "trigger's default)",
    )
    relay_window_ms: float | None = setting(
        None,
        "the relay window, ms, passed to both the trigger and the retrieval stub, which read it as one "
        "setting (unset: their shared default)",
    )
    relay: bool = setting(True, "run the relay; false starts the baseline (retrieval stub without Admit)")
    routing: str = setting(
        "direct",
        "how the trigger and the retrieval stub reach the rankers: direct (each routes its own calls, one "
        "hop less each way) or router (the router runs either way)",
        choices=ROUTINGS,
    )
    base_port: int = setting(50050, "gRPC port of the router; the others follow it (0: free ports)")
    metrics_base_port: int = setting(9100, "metrics port of the router; the others follow it (0: free ports)")
    log_dir: str = setting(".run/logs", "folder of the services' logs, one <service>.log each")
    startup_timeout_s: float = setting(300.0, "seconds each service gets to become healthy", above=0)
    ranker_args: str = setting(
        "--profile-lengths 128,512,2048",
        "extra flags for every ranker (the default: a quick warm-up), each ranker getting its share of the "
        "launcher's CPUs unless these set --torch-threads",
    )
    router_args: str = setting("", "extra flags for the router")
    trigger_args: str = setting("", "extra flags for the trigger")
    stub_args: str = setting(
        "--history-max 2048", "extra flags for the retrieval stub (the default keeps a CPU demo on 2 cores)"
    )
    tls_cert: str = setting("", "PEM certificate chain of every service; with --tls-key the fleet uses TLS")
    tls_key: str = setting("", "PEM private key for --tls-cert")
    tls_ca: str = setting("", "PEM CA bundle every service verifies its peers with; it makes TLS mutual")

    def client_tls(self) -> ServiceConfig:
        """The TLS settings of the fleet's own clients: the launcher's health checks and demo traffic."""
        return ServiceConfig(tls_cert=self.tls_cert, tls_key=self.tls_key, tls_ca=self.tls_ca)

    def tls_args(self) -> list[str]:
        """The TLS flags every service gets."""
        flags = {"--tls-cert": self.tls_cert, "--tls-key": self.tls_key, "--tls-ca": self.tls_ca}
        return [part for flag, path in flags.items() if path for part in (flag, path)]

    def validate(self) -> None:
        check(self)
        self.client_tls().validate()
        if self.rankers < 1:
            raise ValueError("--rankers must be at least 1")
        devices = self.device_list()
        if devices and self.rankers != self.rankers_per_device * len(devices):
            raise ValueError(
                f"--rankers must be --rankers-per-device x the number of --devices "
                f"({self.rankers_per_device} x {len(devices)} = {self.rankers_per_device * len(devices)}), "
                f"got {self.rankers}"
            )
        if devices and self.spare_rankers:
            raise ValueError(
                "--spare-rankers has no device to run on with --devices (each device's rankers split its "
                "budgets): declare spares only for rankers on their own --device"
            )
        if not devices and self.rankers > self.rankers_per_device > 1:
            raise ValueError(
                f"--rankers ({self.rankers}) share one device without --devices: at most "
                f"--rankers-per-device ({self.rankers_per_device}), or name the devices"
            )
        for name in ("base_port", "metrics_base_port"):
            port = getattr(self, name)
            if port and not 0 < port + RANKER_PORT_OFFSET + self.members < 65536:
                raise ValueError(f"--{name.replace('_', '-')} leaves no room for the fleet's ports")
        for name in ("ranker_args", "router_args", "trigger_args", "stub_args"):
            shlex.split(getattr(self, name))

    @property
    def members(self) -> int:
        """The rankers declared as ring members: the started ones and the spares."""
        return self.rankers + self.spare_rankers

    def device_list(self) -> list[str]:
        """`--devices` as a list (empty: none named); a blank entry is refused naming the flag."""
        if not self.devices.strip():
            return []
        names = [name.strip() for name in self.devices.split(",")]
        if not all(names):
            raise ValueError(f"--devices lists an empty device name: {self.devices!r}")
        return names

    def ranker_device_args(self, index: int) -> list[str]:
        """The device flags of ranker `index`: its device where --devices names them, and how many
        rankers share it where more than one does."""
        devices = self.device_list()
        args = ["--device", devices[index // self.rankers_per_device]] if devices else []
        if self.rankers_per_device > 1:
            args += ["--device-sharers", str(self.rankers_per_device)]
        return args

    def ports(self, name: str) -> tuple[int, int]:
        """(gRPC port, metrics port) of a service; 0 means a free port."""
        offset = PORT_OFFSETS.get(name)
        if offset is None:
            offset = RANKER_PORT_OFFSET + int(name.removeprefix("ranker-"))
        return (
            self.base_port + offset if self.base_port else 0,
            self.metrics_base_port + offset if self.metrics_base_port else 0,
        )
