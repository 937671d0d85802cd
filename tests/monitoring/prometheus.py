"""A real Prometheus against a local fleet, for the live monitoring tests: its configuration (one job per
service, the pods labelled as deployed), a child process stopped however a test ends, and its query API."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from services.launcher.fleet import Endpoint
from services.launcher.procs import REPO_ROOT

NAMESPACE = "relaygr"
VARIABLES = {"namespace": NAMESPACE, "pod": ".*", "slo": "0.05", "__rate_interval": "10s"}


def job_of(name: str) -> str:
    return "ranker" if name.startswith("ranker-") else name


def prometheus_config(endpoints: Mapping[str, Endpoint], rules: Path) -> dict:
    jobs: dict[str, list[dict]] = {}
    for name, endpoint in endpoints.items():
        target = {
            "targets": [f"127.0.0.1:{endpoint.metrics_port}"],
            "labels": {"namespace": NAMESPACE, "pod": name},
        }
        jobs.setdefault(job_of(name), []).append(target)
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": job, "static_configs": targets} for job, targets in jobs.items()],
    }


@contextlib.contextmanager
def running(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """A child process in its own session, stopped (SIGTERM, then SIGKILL) however the block is left."""
    with log.open("wb") as out:
        child = subprocess.Popen(
            args, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(5)


class PrometheusApi:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]
