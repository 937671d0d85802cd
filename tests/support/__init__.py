"""What the suite's tests share: request builders (`requests`), polling until a condition holds (`polling`)
and metric readings (`metrics`). Helpers that belong to one folder's subject (an in-process ranker, stub
rankers behind a router, a local fleet under load) stay in that folder's harness."""
