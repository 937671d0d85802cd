"""`python -m services.ranker`: one ranker — the model on one device, its prefix-KV tiers, RankerService."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.common.server import service_main
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


def main(argv: Sequence[str] | None = None) -> None:
    service_main(
        RankerConfig,
        serve,
        argv,
        "ranker",
        "RelayGR ranker: " + __doc__,
        log_name=lambda config: f"ranker[{config.instance_name}]",
    )


if __name__ == "__main__":
    main(sys.argv[1:])
