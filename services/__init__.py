"""RelayGR services: ranker, router, trigger and retrieval stub, plus shared plumbing in `common`."""
