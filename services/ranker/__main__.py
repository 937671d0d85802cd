"""`python -m services.ranker`: one ranker — the model on one device, its prefix-KV tiers, RankerService."""

from __future__ import annotations

import dataclasses
import socket
import sys

from services.common import config as config_lib
from services.common.logs import setup_logging
from services.common.server import run
from services.ranker.app import RankerApp, log
from services.ranker.config import RankerConfig


async def serve(config: RankerConfig) -> None:
    app = RankerApp(config)
    server = app.server()
    await server.start()
    server.install_signal_handlers()
    log.info("warming up %s on %s (model %s)", config.model_preset, app.device, app.runner.model_version)
    try:
        await app.warm_up()
        await server.set_serving()
        await server.wait()
    finally:
        await app.close()


def main(argv: list[str] | None = None) -> None:
    config = config_lib.load(
        RankerConfig, argv, prog="python -m services.ranker", description="RelayGR ranker: " + __doc__
    )
    config = dataclasses.replace(config, instance_name=config.instance_name or socket.gethostname())
    try:
        config.validate()  # the host name, too, must be a name a relay hint can carry
    except ValueError as exc:
        sys.exit(f"python -m services.ranker: error: {exc}")
    setup_logging(config.log_level, f"ranker[{config.instance_name}]")
    run(lambda: serve(config))


if __name__ == "__main__":
    main(sys.argv[1:])
