"""`python -m services.trigger`: the sequence-aware trigger (relaygr.v1.TriggerService)."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.config import load
from services.common.server import run, setup_logging
from services.trigger.config import TriggerConfig
from services.trigger.server import TriggerServer


async def serve(config: TriggerConfig) -> None:
    server = TriggerServer(config)
    await server.start()
    server.grpc.install_signal_handlers()
    await server.wait()


def main(argv: Sequence[str] | None = None) -> None:
    config = load(
        TriggerConfig,
        argv,
        prog="python -m services.trigger",
        description="Sequence-aware trigger: admits at-risk requests for pre-inference within bounds.",
    )
    setup_logging(config.log_level, "trigger")
    run(lambda: serve(config))


if __name__ == "__main__":
    main()
