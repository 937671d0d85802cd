"""ghz configuration files (JSON, ghz's long flag names as keys), read into an open-loop run.

Supported keys, with ghz's meaning:

- `call` (`package.Service.Method` or `package.Service/Method`), `host`;
- `data` (one object, or an array used round-robin) or `data-file` (a JSON file of the same; a relative
  path is taken from the config file's folder): protojson, parsed into the real request messages;
- `metadata` (object of strings); `timeout` (Go duration, default 20s);
- the rate: `rps` (constant), or `load-schedule` `step`/`line` with `load-start`, `load-step`,
  `load-step-duration`, `load-end`, `load-max-duration`;
- the length: `duration` (then `total` is ignored, as in ghz), else `total` (default 200), capped by
  `max-duration`; `skipFirst` leaves the first results out of the report (warm-up);
- `insecure` (ghz's default is TLS), `cacert`, `cert`, `key`; `connections` (channels used round-robin);
  `name` and `tags` are copied into the report.

ghz keys that have no meaning for an open-loop generator, notably `concurrency` (arrivals are not limited
by in-flight requests) and the output options (the report is always ghz's JSON format), are accepted
and ignored. Any other key is an error, so a typo never silently changes a load test. Data is sent
literally: ghz's call-data templates are not expanded.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import Message

import relaygr.v1
from services.loadgen.schedule import RateSchedule

DEFAULT_TOTAL = 200
DEFAULT_TIMEOUT_S = 20.0

SUPPORTED_KEYS = frozenset({
    "call", "host", "data", "data-file", "metadata", "timeout", "rps", "load-schedule", "load-start",
    "load-step", "load-step-duration", "load-end", "load-max-duration", "duration", "total", "max-duration",
    "skipFirst", "insecure", "cacert", "cert", "key", "connections", "name", "tags",
})  # fmt: skip
IGNORED_KEYS = frozenset({
    "proto", "protoset", "import-paths", "concurrency", "concurrency-schedule", "concurrency-start",
    "concurrency-end", "concurrency-step", "concurrency-step-duration", "concurrency-max-duration", "async",
    "cpus", "CPUs", "format", "output", "connect-timeout", "dial-timeout", "keepalive", "reflect-metadata",
    "debug", "enable-compression", "count-errors", "duration-stop", "lb-strategy", "cname", "authority",
})  # fmt: skip

_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str, key: str) -> float:
    """A Go duration string ("500ms", "1m30s") in seconds."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"{key}: expected a Go duration such as '10s', got {text!r}")
    if text == "0":
        return 0.0
    parts = list(_GO_DURATION.finditer(text))
    if not parts or "".join(part.group(0) for part in parts) != text:
        raise ValueError(f"{key}: {text!r} is not a Go duration such as '10s' or '1m30s'")
    return sum(float(part.group(1)) * _GO_UNITS_S[part.group(2)] for part in parts)


@dataclasses.dataclass(frozen=True)
class Method:
    """A unary RPC resolved from its name in the generated descriptors."""

    path: str  # "/package.Service/Method", as on the wire
    request_class: type[Message]
    response_class: type[Message]


def _register_generated_protos() -> None:
    for module in pkgutil.iter_modules(relaygr.v1.__path__):
        if module.name.endswith("_pb2"):
            importlib.import_module(f"relaygr.v1.{module.name}")


def resolve_method(call: str) -> Method:
    """`package.Service.Method` or `package.Service/Method` → its wire path and message classes."""
    _register_generated_protos()
    service_name, _, method_name = call.replace("/", ".").rpartition(".")
    pool = descriptor_pool.Default()
    try:
        method = pool.FindServiceByName(service_name).methods_by_name[method_name]
    except KeyError:
        raise ValueError(f"call: no method {call!r} in the generated relaygr protos") from None
    if method.client_streaming or method.server_streaming:
        raise ValueError(f"call: {call!r} is a streaming method; only unary calls are supported")
    return Method(
        path=f"/{service_name}/{method_name}",
        request_class=message_factory.GetMessageClass(method.input_type),
        response_class=message_factory.GetMessageClass(method.output_type),
    )


def parse_requests(data: Any, request_class: type[Message], source: str) -> tuple[Message, ...]:
    """ghz call data (an object or a non-empty array of objects, protojson) as request messages."""
    entries = data if isinstance(data, list) else [data]
    if not entries or not all(isinstance(entry, dict) for entry in entries):
        raise ValueError(f"{source}: call data must be an object or a non-empty array of objects")
    messages = []
    for position, entry in enumerate(entries):
        try:
            messages.append(json_format.ParseDict(entry, request_class()))
        except json_format.ParseError as exc:
            raise ValueError(f"{source}[{position}]: {exc}") from None
    return tuple(messages)


def _schedule(raw: Mapping[str, Any]) -> RateSchedule:
    kind = raw.get("load-schedule", "const")
    if kind == "const":
        if not raw.get("rps"):
            raise ValueError("rps: an open-loop run needs a rate (rps, or a step/line load-schedule)")
        return RateSchedule.constant(float(raw["rps"]))
    max_duration_s = parse_go_duration(raw.get("load-max-duration", "0"), "load-max-duration")
    start, step, end = (float(raw.get(key, 0)) for key in ("load-start", "load-step", "load-end"))
    if not step:
        raise ValueError(f"load-step: a {kind} load-schedule needs a non-zero load-step")
    if kind == "line":
        return RateSchedule.line(start, step, end, max_duration_s)
    if kind == "step":
        step_duration_s = parse_go_duration(raw.get("load-step-duration", ""), "load-step-duration")
        return RateSchedule(start, step, step_duration_s, end, max_duration_s)
    raise ValueError(f"load-schedule: {kind!r} is not const, step or line")


@dataclasses.dataclass(frozen=True)
class GhzConfig:
    """One load test, as a ghz config file describes it."""

    call: str
    host: str
    method: Method
    requests: tuple[Message, ...]
    schedule: RateSchedule
    duration_s: float | None  # send for this long; None: until `total` are sent
    total: int | None
    timeout_s: float
    metadata: tuple[tuple[str, str], ...]
    skip_first: int
    insecure: bool
    cacert: str
    cert: str
    key: str
    connections: int
    options: Mapping[str, Any]  # the file's settings, echoed in the report as ghz does

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], base_dir: Path = Path()) -> GhzConfig:
        unknown = sorted(set(raw) - SUPPORTED_KEYS - IGNORED_KEYS)
        if unknown:
            raise ValueError(f"unknown ghz config keys: {', '.join(unknown)}")
        for key in ("call", "host"):
            if not raw.get(key):
                raise ValueError(f"{key}: required")
        method = resolve_method(raw["call"])
        if ("data" in raw) == ("data-file" in raw):
            raise ValueError("give exactly one of data and data-file")
        if "data" in raw:
            requests = parse_requests(raw["data"], method.request_class, "data")
        else:
            data_path = base_dir / raw["data-file"]
            requests = parse_requests(json.loads(data_path.read_text()), method.request_class, str(data_path))
        duration_s = parse_go_duration(raw.get("duration", "0"), "duration")
        max_duration_s = parse_go_duration(raw.get("max-duration", "0"), "max-duration")
        total = None if duration_s else int(raw.get("total", DEFAULT_TOTAL))
        if total is not None and total <= 0:
            raise ValueError("total: must be positive")
        metadata = raw.get("metadata") or {}
        if not all(isinstance(v, str) for v in metadata.values()):
            raise ValueError("metadata: values must be strings")
        return cls(
            call=raw["call"],
            host=raw["host"],
            method=method,
            requests=requests,
            schedule=_schedule(raw),
            duration_s=duration_s or max_duration_s or None,
            total=total,
            timeout_s=parse_go_duration(raw["timeout"], "timeout") if "timeout" in raw else DEFAULT_TIMEOUT_S,
            metadata=tuple((str(k).lower(), v) for k, v in metadata.items()),
            skip_first=int(raw.get("skipFirst", 0)),
            insecure=bool(raw.get("insecure", False)),
            cacert=raw.get("cacert", ""),
            cert=raw.get("cert", ""),
            key=raw.get("key", ""),
            connections=max(1, int(raw.get("connections", 1))),
            options=dict(raw),
        )


def load_ghz_config(path: str | Path) -> GhzConfig:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a ghz config is a JSON object")
    return GhzConfig.from_dict(raw, base_dir=path.parent)
