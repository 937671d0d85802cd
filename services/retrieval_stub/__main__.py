"""`python -m services.retrieval_stub`: serve RecommendService until SIGTERM, then drain."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.server import service_main
from services.retrieval_stub.app import RetrievalStubApp
from services.retrieval_stub.config import RetrievalStubConfig


def main(argv: Sequence[str] | None = None) -> None:
    service_main(
        RetrievalStubConfig,
        RetrievalStubApp,
        argv,
        "retrieval_stub",
        "Retrieval stub: synthetic users, Admit at retrieval, Rank through the router.",
    )


if __name__ == "__main__":
    main()
