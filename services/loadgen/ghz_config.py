"""ghz configuration files (JSON, ghz's long flag names as keys), read into an open-loop run.

Supported keys, with ghz's meaning:

- `call` (`package.Service.Method` or `package.Service/Method`), `host`;
- `data` (one object, or an array used round-robin) or `data-file` (a JSON file of the same): protojson,
  parsed into the real request messages;
- `metadata` (object of strings); `timeout` (Go duration, default 20s);
- the rate: `rps` (constant), or `load-schedule` `step`/`line` with `load-start`, `load-step`,
  `load-step-duration`, `load-end`, `load-max-duration`;
- the length: `duration` (then `total` is ignored, as in ghz), else `total` (default 200), capped by
  `max-duration`; `skipFirst` leaves the first results out of the report (warm-up);
- `insecure` (ghz's default is TLS), `cacert`, `cert`, `key`; `connections` (channels used round-robin);
  `lb-strategy` (`pick_first` or `round_robin`: how each channel spreads its calls over the addresses a
  `dns:///` host resolves to, gRPC's client-side balancing); `name` and `tags` are copied into the report.

Values have ghz's types: counts and rates are whole numbers (ghz reads them into Go integers and refuses
20.5), durations are Go duration strings. Relative paths (`data-file`, `protoset`, `proto`, `cacert`,
`cert`, `key`) are taken from the working directory, as ghz takes them, and each must name a file there;
the shipped configs name theirs from the repository root.

ghz keys that have no meaning for an open-loop generator, notably `concurrency` (arrivals are not limited
by in-flight requests) and the output options (the report is always ghz's JSON format), are accepted
and ignored (the report still echoes them, as ghz's would). Any other key is an error, so a typo never
silently changes a load test. Data is sent literally: ghz's call-data templates are not expanded.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import re
from collections.abc import Mapping
from fractions import Fraction
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
    "skipFirst", "insecure", "cacert", "cert", "key", "connections", "lb-strategy", "name", "tags",
})  # fmt: skip
IGNORED_KEYS = frozenset({
    "proto", "protoset", "import-paths", "concurrency", "concurrency-schedule", "concurrency-start",
    "concurrency-end", "concurrency-step", "concurrency-step-duration", "concurrency-max-duration", "async",
    "cpus", "CPUs", "format", "output", "connect-timeout", "dial-timeout", "keepalive", "reflect-metadata",
    "debug", "enable-compression", "count-errors", "duration-stop", "cname", "authority",
})  # fmt: skip

# gRPC load-balancing policies a channel can be given by name (empty: gRPC's default, pick_first).
LB_STRATEGIES = frozenset({"", "pick_first", "round_robin"})
# Keys whose values are paths ghz reads, relative to its working directory.
PATH_KEYS = ("data-file", "protoset", "proto", "cacert", "cert", "key")
# ghz sets `total` to this when a duration bounds the run (runner/options.go).
GHZ_DURATION_TOTAL = 2**31 - 1

_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS_NS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}


def go_duration_ns(text: str, key: str) -> int:
    """A Go duration string ("500ms", "1m30s") in whole nanoseconds, as Go's time.ParseDuration reads it:
    the unit of time.Duration, which is how ghz's report writes durations."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"{key}: expected a Go duration such as '10s', got {text!r}")
    if text == "0":
        return 0
    parts = list(_GO_DURATION.finditer(text))
    if not parts or "".join(part.group(0) for part in parts) != text:
        raise ValueError(f"{key}: {text!r} is not a Go duration such as '10s' or '1m30s'")
    return int(sum(Fraction(part.group(1)) * _GO_UNITS_NS[part.group(2)] for part in parts))


def parse_go_duration(text: str, key: str) -> float:
    """A Go duration string ("500ms", "1m30s") in seconds."""
    return go_duration_ns(text, key) / 1e9


def whole(raw: Mapping[str, Any], key: str, default: int = 0, minimum: int | None = 0) -> int:
    """`raw[key]` as ghz reads it into a Go integer (uint where `minimum` is 0): a JSON whole number."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}: ghz takes a whole number here, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{key}: must be at least {minimum}, got {value}")
    return value


def _text(raw: Mapping[str, Any], key: str, default: str = "") -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key}: ghz takes a string here, got {value!r}")
    return value


def _flag(raw: Mapping[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key}: ghz takes true or false here, got {value!r}")
    return value


def _duration(raw: Mapping[str, Any], key: str, default: str = "0") -> int:
    return go_duration_ns(raw.get(key, default), key)


# runner.Options fields tagged `omitempty`: Go's encoder leaves them out when zero, false, empty or nil.
_OMIT_EMPTY = frozenset({
    "call", "host", "proto", "protoset", "import-paths", "enable-compression", "cacert", "cert", "key",
    "cname", "skipTLS", "authority", "rps", "concurrency", "total", "async", "connections", "duration",
    "timeout", "dial-timeout", "keepalive", "data", "metadata", "name", "skipFirst", "count-errors",
})  # fmt: skip


def ghz_options(raw: Mapping[str, Any], data: Any) -> dict[str, Any]:
    """The `options` of ghz's JSON report for this config: the fields of ghz's runner.Options (v0.120) with
    its JSON types (durations in integer nanoseconds, counts as integers), ghz's defaults where the config
    is silent, `omitempty` fields left out when empty, and `data` holding the call data, which ghz reads a
    data-file into. `CPUs` is 1: the open-loop generator sends from one event loop."""
    duration_ns = _duration(raw, "max-duration") or _duration(raw, "duration")
    metadata = raw.get("metadata") or None
    import_paths = raw.get("import-paths", [])
    if not isinstance(import_paths, list) or not all(isinstance(path, str) for path in import_paths):
        raise ValueError(f"import-paths: ghz takes a list of paths here, got {import_paths!r}")
    options = {
        "call": _text(raw, "call"),
        "host": _text(raw, "host"),
        "proto": _text(raw, "proto"),
        "protoset": _text(raw, "protoset"),
        "import-paths": import_paths,
        "enable-compression": _flag(raw, "enable-compression"),
        "cacert": _text(raw, "cacert"),
        "cert": _text(raw, "cert"),
        "key": _text(raw, "key"),
        "cname": _text(raw, "cname"),
        "skipTLS": _flag(raw, "skipTLS"),
        "insecure": _flag(raw, "insecure"),
        "authority": _text(raw, "authority"),
        "rps": whole(raw, "rps"),
        "load-schedule": _text(raw, "load-schedule", "const"),
        "load-start": whole(raw, "load-start"),
        "load-end": whole(raw, "load-end"),
        "load-step": whole(raw, "load-step", minimum=None),
        "load-step-duration": _duration(raw, "load-step-duration"),
        "load-max-duration": _duration(raw, "load-max-duration"),
        "concurrency": whole(raw, "concurrency", 50),
        "concurrency-schedule": _text(raw, "concurrency-schedule", "const"),
        "concurrency-start": whole(raw, "concurrency-start", 1),
        "concurrency-end": whole(raw, "concurrency-end"),
        "concurrency-step": whole(raw, "concurrency-step", minimum=None),
        "concurrency-step-duration": _duration(raw, "concurrency-step-duration"),
        "concurrency-max-duration": _duration(raw, "concurrency-max-duration"),
        "total": GHZ_DURATION_TOTAL if duration_ns else whole(raw, "total", DEFAULT_TOTAL),
        "async": _flag(raw, "async"),
        "connections": whole(raw, "connections", 1),
        "duration": duration_ns,
        "timeout": _duration(raw, "timeout", "20s"),
        "dial-timeout": _duration(raw, "connect-timeout", "10s"),
        "keepalive": _duration(raw, "keepalive"),
        "data": data,
        "binary": False,
        "metadata": metadata,
        "CPUs": 1,
        "name": _text(raw, "name"),
        "skipFirst": whole(raw, "skipFirst"),
        "count-errors": _flag(raw, "count-errors"),
    }
    return {key: value for key, value in options.items() if key not in _OMIT_EMPTY or value}


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
        if not whole(raw, "rps"):
            raise ValueError("rps: an open-loop run needs a rate (rps, or a step/line load-schedule)")
        return RateSchedule.constant(float(raw["rps"]))
    max_duration_s = parse_go_duration(raw.get("load-max-duration", "0"), "load-max-duration")
    start, end = float(whole(raw, "load-start")), float(whole(raw, "load-end"))
    step = float(whole(raw, "load-step", minimum=None))
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
    paths: Mapping[str, Path]  # the config's PATH_KEYS, resolved from the base folder
    connections: int
    lb_strategy: str  # gRPC's load-balancing policy of each channel; empty: gRPC's default (pick_first)
    name: str
    tags: Mapping[str, str]
    options: Mapping[str, Any]  # ghz's report `options` for this config (`ghz_options`)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], base_dir: Path = Path()) -> GhzConfig:
        """The config `raw`, its relative paths taken from `base_dir` (ghz's working directory)."""
        unknown = sorted(set(raw) - SUPPORTED_KEYS - IGNORED_KEYS)
        if unknown:
            raise ValueError(f"unknown ghz config keys: {', '.join(unknown)}")
        for key in ("call", "host"):
            if not raw.get(key):
                raise ValueError(f"{key}: required")
        method = resolve_method(raw["call"])
        paths = resolve_paths(raw, base_dir)
        if ("data" in raw) == ("data-file" in raw):
            raise ValueError("give exactly one of data and data-file")
        if "data" in raw:
            data, source = raw["data"], "data"
        else:
            source = str(paths["data-file"])
            try:
                data = json.loads(paths["data-file"].read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"data-file: {source} is not JSON: {exc}") from None
        requests = parse_requests(data, method.request_class, source)
        options = ghz_options(raw, data)
        duration_s = parse_go_duration(raw.get("duration", "0"), "duration")
        max_duration_s = parse_go_duration(raw.get("max-duration", "0"), "max-duration")
        total = None if duration_s else whole(raw, "total", DEFAULT_TOTAL)
        if total is not None and total <= 0:
            raise ValueError("total: must be positive")
        metadata = raw.get("metadata") or {}
        if not all(isinstance(v, str) for v in metadata.values()):
            raise ValueError("metadata: values must be strings")
        tags = raw.get("tags") or {}
        if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
            raise ValueError("tags: ghz takes an object of strings here")
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
            skip_first=options.get("skipFirst", 0),
            insecure=options["insecure"],
            paths=paths,
            connections=max(1, options.get("connections", 1)),
            lb_strategy=_lb_strategy(raw),
            name=options.get("name", ""),
            tags=dict(tags),
            options=options,
        )


def _lb_strategy(raw: Mapping[str, Any]) -> str:
    strategy = _text(raw, "lb-strategy")
    if strategy not in LB_STRATEGIES:
        raise ValueError(f"lb-strategy: {strategy!r} is not one of {', '.join(sorted(LB_STRATEGIES))}")
    return strategy


def resolve_paths(raw: Mapping[str, Any], base_dir: Path) -> dict[str, Path]:
    """The files the config names (PATH_KEYS), relative ones taken from `base_dir`; each must exist."""
    paths = {}
    for key in PATH_KEYS:
        value = _text(raw, key)
        if not value:
            continue
        path = base_dir / value
        if not path.is_file():
            raise ValueError(
                f"{key}: no file {value} in {base_dir.resolve()} (ghz takes a config's paths from the "
                "working directory; the shipped configs name theirs from the repository root)"
            )
        paths[key] = path
    return paths


def load_ghz_config(path: str | Path, base_dir: Path | None = None) -> GhzConfig:
    """The ghz config file at `path`, its relative paths taken from `base_dir` (default: the working
    directory, as ghz takes them)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a ghz config is a JSON object")
    return GhzConfig.from_dict(raw, base_dir=Path.cwd() if base_dir is None else base_dir)
