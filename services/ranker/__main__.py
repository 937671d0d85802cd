"""`python -m services.ranker`: one ranker — the model on one device, its prefix-KV tiers, RankerService."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.common.server import service_main
from services.ranker.app import RankerApp
from services.ranker.config import RankerConfig


def main(argv: Sequence[str] | None = None) -> None:
    service_main(
        RankerConfig,
        RankerApp,
        argv,
        "ranker",
        "RelayGR ranker: " + __doc__,
        log_name=lambda config: f"ranker[{config.instance_name}]",
    )


if __name__ == "__main__":
    main(sys.argv[1:])
