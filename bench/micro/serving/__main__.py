"""`python -m bench serving`: what one ranker's serving path costs the host beyond its model; with
`--in-turn-against`, rankers driven in turn by the same pairs instead (`in_turn`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.micro.serving import in_turn
from bench.micro.serving.config import ServingConfig
from bench.micro.serving.run import run
from bench.micro.serving.summary import summary, write
from services.common.config import load


def main(argv: list[str] | None = None) -> None:
    config = load(ServingConfig, argv, prog="python -m bench serving", description=__doc__)
    if config.in_turn_against:  # the table goes to stdout only: redirect it (in_turn's docstring)
        print(in_turn.table(asyncio.run(in_turn.compare(config)), config))
        return
    result = asyncio.run(run(config))
    print(summary(result))
    if config.out:
        write(result, Path(config.out))
