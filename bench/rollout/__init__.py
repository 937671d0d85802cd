"""`python -m bench rollout`: the cache handoff through a rolling restart, a scale-out and a scale-in.

`config` (its settings), `plan` (the phases and the fleet changes), `run` (one fleet's run: the load, the
changes, the metrics scraped), `analysis` (one run's arithmetic), `summary` (a run's summary and the figures
across runs, off against on) and `report` (summary.md, timeline.csv, timeline.png).
"""
