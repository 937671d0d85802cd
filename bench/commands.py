"""The commands of `python -m bench <command>`: one table, a line per command.

Each `Command` names the function that runs it: the function takes the command's own arguments, parses
them with the command's settings class (every flag with its `RELAYGR_…` twin, which `--help` lists) and
runs. A command's module is imported only when that command runs, so `python -m bench --help` imports
none of them. Commands import the library (`bench.lib`: `bench.lib.config`, `bench.lib.sweep`, …); the
library never imports a command.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    # "module:function"; the function takes the command's arguments and returns an exit status (None: 0).
    target: str
    # Flags put before the user's arguments, so that the user's own flags override them.
    preset: tuple[str, ...] = ()

    def main(self, argv: Sequence[str]) -> int:
        module, function = self.target.split(":")
        status = getattr(importlib.import_module(module), function)([*self.preset, *argv])
        return status if isinstance(status, int) else 0


COMMANDS = (
    Command(
        "run",
        "baseline, RelayGR and its ablations side by side: length and load sweeps (--profile quick|full|gpu)",
        "bench.run.__main__:main",
    ),
    Command(
        "headline",
        "the headline: RelayGR at multiples of the baseline's load, in randomized interleaved blocks",
        "bench.headline.__main__:main",
    ),
    Command(
        "reproduce",
        "whether two headline runs agree: the same k claimed, every r_k's intervals overlapping",
        "bench.headline.compare:main",
    ),
    Command(
        "ab",
        "a fixed-load A/B of two or more modes: the same users and arrivals, with intervals",
        "bench.ab.__main__:main",
    ),
    Command(
        "report",
        "render a folder's report again from its results, by the renderer of the command that wrote it",
        "bench.report.__main__:main",
    ),
    Command(
        "readme",
        "render the README's Results from committed headline, run and rollout results",
        "bench.report.readme:main",
    ),
    Command(
        "tracing",
        "what OpenTelemetry tracing costs the fleet, and one relayed request's timeline",
        "bench.tracing.__main__:main",
    ),
    Command(
        "mlperf",
        "MLCommons LoadGen (Server or Offline) against the fleet's Recommend, or a search",
        "bench.mlperf.__main__:main",
    ),
    Command(
        "rollout",
        "the rankers' cache handoff through a rolling restart and a scale-out and in, off against on",
        "bench.rollout.__main__:main",
    ),
    Command(
        "serving",
        "what one ranker's serving path costs the host beyond its model; rankers in turn: --in-turn-against",
        "bench.micro.serving.__main__:main",
    ),
    Command(
        "shared-device",
        "K rankers on one simulated accelerator (an H200's pass times): how busy they keep it",
        "bench.micro.shared_device:main",
    ),
    Command(
        "accelerator",
        "the ranker's device path in process, and each DRAM precision's score error (--measures)",
        "bench.micro.accelerator.__main__:main",
    ),
    Command(
        "floors",
        "the floors under every hop: a unary gRPC call's CPU, and the latency the router hop adds (--floors)",
        "bench.micro.floors:main",
    ),
)
BY_NAME = {command.name: command for command in COMMANDS}


def usage() -> str:
    """`python -m bench --help`: every command with its one-line help."""
    width = max(len(command.name) for command in COMMANDS)
    rows = "\n".join(f"  {command.name:<{width}}  {command.help}" for command in COMMANDS)
    return (
        "usage: python -m bench <command> [flags]\n\n"
        "RelayGR's benchmarks; results go to bench/results/<name>/ (docs/benchmark.md).\n\n"
        f"commands:\n{rows}\n\n"
        "`python -m bench <command> --help` lists the command's flags, each with its RELAYGR_… twin."
    )
