"""`python -m services.router`: the affinity router in front of the rankers (see services.router.server)."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.server import service_main
from services.router.config import RouterConfig
from services.router.server import RouterServer


async def serve(config: RouterConfig) -> None:
    router = RouterServer(config)
    await router.start()
    await router.serve_until_signalled()


def main(argv: Sequence[str] | None = None) -> None:
    service_main(
        RouterConfig,
        serve,
        argv,
        "router",
        "Consistent-hash affinity router: relaygr.v1.RankerService in front of the rankers.",
    )


if __name__ == "__main__":
    main()
