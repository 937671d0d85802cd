"""The start-up heap frozen out of the garbage collector's way, and collections' pauses measured.

Tested by the mechanism, never by timing: once warm, a full collection has only what the service made
since start-up to traverse (the collector's own object lists), and the metrics a process exports say so.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import grpc
import pytest

from relaygr.v1 import ranker_pb2_grpc
from services.launcher.procs import Processes
from tests.support.metrics import scrape, value
from tests.support.requests import rank_request

ARGS = [
    "--model-preset", "cpu-tiny", "--instance-name", "ranker-gc", "--profile-lengths", "16,64",
    "--profile-repeats", "1", "--drain-grace-s", "1",
]  # fmt: skip


def test_freezing_leaves_a_full_collection_only_what_came_after():
    """In a fresh interpreter (the test process keeps its own collector): once `on_serving` froze the heap,
    the objects a full collection traverses are those made since, a small part of the frozen ones."""
    script = textwrap.dedent(
        """
        import gc
        import torch  # a heap the size of a service's
        from services.common import garbage
        garbage.install(freeze=True)
        before = len(gc.get_objects())
        garbage.on_serving()
        garbage.on_serving()  # once only
        kept = [[i] for i in range(1000)]  # made after warm-up: still collected
        print(before, gc.get_freeze_count(), len(gc.get_objects()), garbage.GC_FROZEN_OBJECTS._value.get())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, frozen, traversed, gauge = (int(float(word)) for word in done.stdout.split())
    assert before > 50_000 and frozen >= before * 0.9
    assert gauge == frozen
    assert 1000 <= traversed < frozen / 10


def test_without_freeze_nothing_is_frozen():
    script = (
        "import gc; from services.common import garbage; garbage.install(freeze=False); "
        "garbage.on_serving(); print(gc.get_freeze_count())"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]


@pytest.mark.parametrize("freeze", [True, False])
def test_a_service_process_freezes_once_warm_and_reports_its_pauses(freeze):
    with Processes() as procs:
        ranker = procs.start(
            "ranker-gc", "services.ranker", "relaygr.v1.RankerService", [*ARGS, "--gc-freeze", str(freeze)]
        )
        ranker.wait_healthy(60)
        with grpc.insecure_channel(ranker.address) as channel:
            stub = ranker_pb2_grpc.RankerServiceStub(channel)
            for user in range(20):
                stub.Rank(rank_request(f"u{user}", list(range(1, 40)), [1], [2, 3]), timeout=10)
        samples = scrape(ranker.metrics_port)
    frozen = value(samples, "relaygr_gc_frozen_objects")
    if freeze:
        assert frozen > 50_000  # torch, gRPC and the model's Python objects
    else:
        assert frozen == 0
    # Every collection is timed, by generation: Ranks allocate, so the youngest generation was collected;
    # freezing collects fully once first.
    assert value(samples, "relaygr_gc_pause_seconds_count", generation="0") > 0
    if freeze:
        assert value(samples, "relaygr_gc_pause_seconds_count", generation="2") >= 1
