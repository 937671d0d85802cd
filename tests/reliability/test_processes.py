"""Service processes start reliably while the parent is busy with gRPC, and never outlive the parent.

A fleet's tests and launcher restart services while their own gRPC clients run. A child that ran Python
between fork and exec (a `preexec_fn`) crashed with SIGSEGV in about one start in four under such load;
children now ask for their parent-death signal themselves (`services.launcher.child`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.launcher.procs import REPO_ROOT, Processes
from tests.support.polling import wait_for


def busy_grpc(stop: threading.Event) -> None:
    """A health server and a client calling it as fast as they can, on this thread's event loop."""

    async def main() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            while not stop.is_set():
                await asyncio.gather(*(check(health_pb2.HealthCheckRequest()) for _ in range(20)))
        await server.stop(None)

    asyncio.run(main())


def test_children_start_cleanly_while_the_parents_grpc_threads_are_busy() -> None:
    stop = threading.Event()
    load = threading.Thread(target=busy_grpc, args=(stop,))
    load.start()
    try:
        time.sleep(0.5)
        with Processes() as procs:
            # `python -m this --port P --metrics-port M` prints and exits 0: all a start needs to show.
            exits = [procs.start(f"child-{i}", "this", "none").popen.wait(30) for i in range(30)]
    finally:
        stop.set()
        load.join()
    assert exits == [0] * 30


PARENT = textwrap.dedent(
    """
    import sys, time
    from services.launcher.procs import Processes
    procs = Processes()
    members = ["--rankers", "r=127.0.0.1:9"]
    child = procs.start("router", "services.router", "relaygr.v1.RankerService", members)
    print(child.popen.pid, flush=True)
    time.sleep(600)
    """
)


def test_children_die_with_a_parent_killed_without_cleaning_up() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)  # the child is up and has asked for its parent-death signal
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(gone, 15, "the orphaned child exits")
    finally:
        parent.kill()
