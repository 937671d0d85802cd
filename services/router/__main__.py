"""`python -m services.router`: the affinity router in front of the rankers (see services.router.app)."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.server import service_main
from services.router.app import RouterApp
from services.router.config import RouterConfig


def main(argv: Sequence[str] | None = None) -> None:
    service_main(
        RouterConfig,
        RouterApp,
        argv,
        "router",
        "Consistent-hash affinity router: relaygr.v1.RankerService in front of the rankers.",
    )


if __name__ == "__main__":
    main()
