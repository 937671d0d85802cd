"""`python -m tools.dashboards` regenerates the dashboards and the PrometheusRule; `--check` only compares."""

from __future__ import annotations

import argparse
import sys

from tools.dashboards.generate import REPO_ROOT, render, stale, write


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.dashboards", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs; write nothing"
    )
    args = parser.parse_args()
    outputs = render()
    paths = stale(outputs) if args.check else write(outputs)
    for path in paths:
        print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(REPO_ROOT)}")
    return 1 if args.check and paths else 0


if __name__ == "__main__":
    sys.exit(main())
