"""`python -m services.trigger`: the sequence-aware trigger (relaygr.v1.TriggerService)."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.server import service_main
from services.trigger.app import TriggerApp
from services.trigger.config import TriggerConfig


def main(argv: Sequence[str] | None = None) -> None:
    service_main(
        TriggerConfig,
        TriggerApp,
        argv,
        "trigger",
        "Sequence-aware trigger: admits at-risk requests for pre-inference within bounds.",
    )


if __name__ == "__main__":
    main()
