"""The flake hunt (`make test-stress`): the fast suite several times over while a CPU hog takes one core,
then every test that failed at least once, with how many rounds it failed in.

A test that passes alone but fails when the machine is busy reads an effect before it has happened (a
metric counted after the response, a span exported after the call); this makes such tests fail often
enough to be seen before CI sees them. The report goes to stdout and, with `--out`, to a file.

    python -m tools.flake_hunt --rounds 3 --hog-cores 1 --out flake-hunt.txt -- -m "not slow"
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def cpu_hog(cores: int) -> Iterator[None]:
    """`cores` processes that each spin one core at full use until the block ends."""
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(cores)]
    for hog in hogs:
        hog.start()
    try:
        yield
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.join()


def failures(junit: Path) -> list[str]:
    """The node ids of the tests a JUnit report records as failed or errored."""
    failed = []
    for case in ET.parse(junit).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return failed


def run_round(pytest_args: list[str], junit: Path) -> tuple[int, float]:
    """One pass of the suite; its exit code and wall seconds. Stopped early (SIGTERM, Ctrl-C), the pass is
    stopped with it (the fleets its tests started end with their parent)."""
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    with subprocess.Popen([*command, *pytest_args]) as suite:
        try:
            code = suite.wait()
        except BaseException:
            suite.terminate()  # SIGINT may be ignored (a background job's); the tests' children follow it
            suite.wait()
            raise
    return code, time.monotonic() - started


def report(rounds: list[tuple[int, float, list[str]]], hog_cores: int, pytest_args: list[str]) -> str:
    counts = collections.Counter(test for _, _, failed in rounds for test in set(failed))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"flake hunt, {when}: {len(rounds)} rounds of pytest {' '.join(pytest_args)} with {hog_cores} of "
        f"{os.cpu_count()} cores taken by a CPU hog ({platform.processor() or platform.machine()})",
    ]
    for index, (code, seconds, failed) in enumerate(rounds, 1):
        lines.append(f"round {index}: exit {code}, {seconds:.0f} s, {len(failed)} failed")
    if counts:
        lines.append("failed at least once (rounds failed / rounds run):")
        lines += [f"  {count}/{len(rounds)}  {test}" for test, count in counts.most_common()]
    else:
        lines.append("no test failed")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="passes of the suite (default 3)")
    parser.add_argument("--hog-cores", type=int, default=1, help="cores the CPU hog spins (default 1)")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest selects (default: the suite)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the hog and the running pass are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    rounds = []
    with tempfile.TemporaryDirectory() as scratch, cpu_hog(args.hog_cores):
        for index in range(args.rounds):
            junit = Path(scratch) / f"round-{index}.xml"
            code, seconds = run_round(args.pytest_args, junit)
            rounds.append((code, seconds, failures(junit) if junit.exists() else ["<no junit report>"]))
            text = report(rounds, args.hog_cores, args.pytest_args)
            if args.out:
                args.out.write_text(text)
    print(text, end="")
    return 1 if any(failed for _, _, failed in rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
