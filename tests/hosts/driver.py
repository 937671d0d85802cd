"""A client inside a test host, driven by the test from outside: the test's hands and eyes on the network.

The test process stays in the machine's own namespace, from which no test host can be reached; it starts
this module in a host (`python -m services.launcher.child PID tests.hosts.driver`, through `ip netns exec`)
and talks to it over stdin and stdout, one JSON object a line each way: a command `{"op": ..., args}` and
its answer `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`. Logs go to stderr.

Commands: `serving` (one gRPC health check), `srv` (the SRV records of a name, looked up as the router,
the trigger and the stub look them up), `members` (the router's routable members, by GetProfile), `scrape`
(a metrics page), `start_load` / `stop_load` (open-loop Recommend load in the background, and every call's
outcome).
`Driver` is the test's side of the conversation.
"""

from __future__ import annotations

import json
import logging
import select
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.affinity.discovery import srv_lookup
from services.common.contract import cache_source_label
from services.launcher.procs import health_status
from tests.reliability.harness import BackgroundLoad, recommend_load
from tests.support.metrics import Samples, samples, scrape

log = logging.getLogger("driver")

# Samples as they cross the pipe between the driver and its agent: (name, labels, value).
Rows = list[tuple[str, dict[str, str], float]]


class Agent:
    """The driver's side: runs each command inside its host."""

    def __init__(self) -> None:
        self.load: BackgroundLoad | None = None
        self.users = 0

    def serving(self, address: str, service: str) -> bool:
        return health_status(address, service, timeout=0.5) == health_pb2.HealthCheckResponse.SERVING

    def srv(self, name: str) -> list[tuple[str, int]]:
        return sorted((record.target, record.port) for record in srv_lookup(name))

    def members(self, address: str) -> list[str]:
        with grpc.insecure_channel(address) as channel:
            profile = ranker_pb2_grpc.RankerServiceStub(channel).GetProfile(
                ranker_pb2.GetProfileRequest(), timeout=5
            )
        return list(profile.members)

    def scrape(self, url: str) -> Rows:
        return [(name, dict(labels), value) for (name, labels), value in scrape(url).items()]

    def start_load(self, address: str, rate: float, users: int, seed: int) -> float:
        """Starts Recommend calls to `address`, round-robin over `users` users; returns when sending began
        (time.monotonic(), the machine's clock, the same in every namespace)."""
        if self.load is not None:
            raise RuntimeError("a load runs already")
        self.users = users
        self.load = recommend_load(address, rate, users=users, seed=seed).start()
        while not self.load.started_at:  # stamped by the load's own thread once its channel is open
            time.sleep(0.001)
        return self.load.started_at

    def stop_load(self) -> list[dict[str, Any]]:
        """Stops the load, waits for the calls in flight, and returns every call's outcome in send order."""
        if self.load is None:
            raise RuntimeError("no load runs")
        records, self.load = self.load.stop(), None
        return [
            {
                "user": f"user-{record.index % self.users}",
                "intended_s": record.intended_s,
                "latency_s": record.latency_s,
                "code": record.code.name,
                "details": record.details,
                "instance": record.response.instance if record.ok else "",
                "cache_source": cache_source_label(record.response.cache_source) if record.ok else "",
                "admitted": record.response.admitted if record.ok else False,
            }
            for record in records
        ]

    def ops(self) -> dict[str, Callable[..., Any]]:
        return {
            "serving": self.serving,
            "srv": self.srv,
            "members": self.members,
            "scrape": self.scrape,
            "start_load": self.start_load,
            "stop_load": self.stop_load,
        }


def serve() -> None:
    """Answers commands from stdin until it closes."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s driver %(message)s")
    ops = Agent().ops()
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            if op not in ops:
                raise ValueError(f"no command {op!r}; there are {', '.join(ops)}")
            answer = {"ok": True, "result": ops[op](**command)}
        except Exception as exc:  # the test gets it as the command's error
            log.warning("%s failed: %s", op, exc)
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class DriverError(RuntimeError):
    """A command failed inside the host, or the driver did not answer."""


class Driver:
    """The test's side: sends a command to the agent in the host and waits for its answer."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen

    def call(self, op: str, timeout_s: float = 30.0, **args: Any) -> Any:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self.popen.stdin.flush()
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout_s)
        line = self.popen.stdout.readline() if ready else b""
        if not line:
            state = "exited" if self.popen.poll() is not None else f"gave no answer in {timeout_s:.0f}s"
            raise DriverError(f"the driver {state} on {op}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise DriverError(f"{op}: {answer['error']}")
        return answer["result"]

    def serving(self, address: str, service: str) -> bool:
        return self.call("serving", address=address, service=service)

    def srv(self, name: str) -> list[tuple[str, int]]:
        return [(target, port) for target, port in self.call("srv", name=name)]

    def members(self, address: str) -> list[str]:
        return self.call("members", address=address)

    def scrape(self, url: str) -> Samples:
        """Every sample of the metrics endpoint at `url`, read from inside the hosts' network."""
        return samples(self.call("scrape", url=url))

    def start_load(self, address: str, rate: float, users: int, seed: int) -> float:
        return self.call("start_load", address=address, rate=rate, users=users, seed=seed)

    def stop_load(self) -> list[dict[str, Any]]:
        return self.call("stop_load", timeout_s=60.0)


if __name__ == "__main__":
    serve()
