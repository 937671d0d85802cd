"""RelayGR on mix 1 with the trigger's placement by the rankers' queues (`--relay-window-ms`, the fleet's
100 ms window) against every prefix on its ring owner (`relay-owner-only`: the trigger's
`--relay-window-ms 0`), as a fixed-load A/B (`python -m bench.ab`): both fleets up at once, 5 load seeds at
45 Recommend/s, each run 1275 measured Recommends after 5 s of warm-up (1500 sent) with no early stop, so
the counts of Ranks over the SLO compare. From the repository root: `python -m bench.studies.placement_ab`;
any `bench.ab` flag after it replaces the study's (e.g. `--rates 40,45 --name placement-ab-2`).

bench/results/placement-ab/ was measured before `bench.ab` existed, by this study's first form (the same
runs, load seeds 0-2, rows of counts without intervals)."""

import sys

from bench.ab.__main__ import main

STUDY = ["--modes", "relay,relay-owner-only", "--rates", "45", "--seeds", "5", "--requests", "1275"]

if __name__ == "__main__":
    main([*STUDY, *sys.argv[1:]])
