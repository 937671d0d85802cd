"""ghz's report types, written from its Go source (github.com/bojand/ghz v0.120.0, runner/reporter.go and
runner/reason.go), and a decoder that accepts exactly what Go's encoding/json accepts into them.

A report the project writes must decode into these types, as ghz's tooling and ghz-web (which binds a
posted report into runner.Report) would: integers are JSON numbers without a fraction (time.Duration is
an int64 of nanoseconds, so "60s" is refused), time.Time is an RFC 3339 string, maps and slices hold
their element type, null leaves a field at its zero value, and an unknown key is skipped (Go matches
keys to fields case-insensitively).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# time.Duration: `type Duration int64`, nanoseconds.
DURATION = "int64"

# type Options struct (runner/reporter.go): JSON key -> Go type.
OPTIONS: dict[str, Any] = {
    "call": "string",
    "host": "string",
    "proto": "string",
    "protoset": "string",
    "import-paths": ["string"],
    "enable-compression": "bool",
    "cacert": "string",
    "cert": "string",
    "key": "string",
    "cname": "string",
    "skipTLS": "bool",
    "insecure": "bool",
    "authority": "string",
    "rps": "int",
    "load-schedule": "string",
    "load-start": "int",
    "load-end": "int",
    "load-step": "int",
    "load-step-duration": DURATION,
    "load-max-duration": DURATION,
    "concurrency": "int",
    "concurrency-schedule": "string",
    "concurrency-start": "int",
    "concurrency-end": "int",
    "concurrency-step": "int",
    "concurrency-step-duration": DURATION,
    "concurrency-max-duration": DURATION,
    "total": "int",
    "async": "bool",
    "connections": "int",
    "duration": DURATION,
    "timeout": DURATION,
    "dial-timeout": DURATION,
    "keepalive": DURATION,
    "data": "interface{}",
    "binary": "bool",
    "metadata": {"map": "string"},  # *map[string]string
    "CPUs": "int",
    "name": "string",
    "skipFirst": "int",
    "count-errors": "bool",
}
# Options fields without `omitempty`: Go's encoder always writes them, so ghz's own reports have them.
OPTIONS_ALWAYS = frozenset({
    "insecure", "load-schedule", "load-start", "load-end", "load-step", "load-step-duration",
    "load-max-duration", "concurrency-schedule", "concurrency-start", "concurrency-end", "concurrency-step",
    "concurrency-step-duration", "concurrency-max-duration", "binary", "CPUs",
})  # fmt: skip

LATENCY_DISTRIBUTION = {"percentage": "int", "latency": DURATION}
BUCKET = {"mark": "float64", "count": "int", "frequency": "float64"}
RESULT_DETAIL = {"timestamp": "time.Time", "latency": DURATION, "error": "string", "status": "string"}

# type Report struct.
REPORT: dict[str, Any] = {
    "name": "string",
    "endReason": "StopReason",
    "date": "time.Time",
    "options": OPTIONS,
    "count": "uint64",
    "total": DURATION,
    "average": DURATION,
    "fastest": DURATION,
    "slowest": DURATION,
    "rps": "float64",
    "errorDistribution": {"map": "int"},
    "statusCodeDistribution": {"map": "int"},
    "latencyDistribution": [LATENCY_DISTRIBUTION],
    "histogram": [BUCKET],
    "details": [RESULT_DETAIL],
    "tags": {"map": "string"},
}

_INT_RANGES = {"int": (-(2**63), 2**63 - 1), "int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1)}
# time.Time's UnmarshalJSON: RFC 3339, optional fraction, "Z" or a numeric offset.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})")


def decode(value: Any, go_type: Any, where: str = "report") -> tuple[list[str], list[str]]:
    """Decodes `value` (parsed JSON) into `go_type` as Go would: (errors, unknown keys skipped)."""
    errors: list[str] = []
    unknown: list[str] = []
    _decode(value, go_type, where, errors, unknown)
    return errors, unknown


def _decode(value: Any, go_type: Any, where: str, errors: list[str], unknown: list[str]) -> None:
    if value is None:
        return  # null: the field keeps its zero value
    if isinstance(go_type, Mapping) and "map" not in go_type:
        _decode_struct(value, go_type, where, errors, unknown)
    elif isinstance(go_type, Mapping):
        if not isinstance(value, dict):
            errors.append(f"{where}: cannot unmarshal {type(value).__name__} into a map")
            return
        for key, element in value.items():
            _decode(element, go_type["map"], f"{where}[{key!r}]", errors, unknown)
    elif isinstance(go_type, list):
        if not isinstance(value, list):
            errors.append(f"{where}: cannot unmarshal {type(value).__name__} into a slice")
            return
        for position, element in enumerate(value):
            _decode(element, go_type[0], f"{where}[{position}]", errors, unknown)
    else:
        problem = _scalar_problem(value, go_type)
        if problem:
            errors.append(f"{where}: cannot unmarshal {value!r} into {go_type}: {problem}")


def _decode_struct(value: Any, fields: Mapping[str, Any], where: str, errors: list[str], unknown: list[str]):
    if not isinstance(value, dict):
        errors.append(f"{where}: cannot unmarshal {type(value).__name__} into a struct")
        return
    folded = {name.casefold(): name for name in fields}
    for key, element in value.items():
        name = key if key in fields else folded.get(key.casefold())
        if name is None:
            unknown.append(f"{where}.{key}")
            continue
        _decode(element, fields[name], f"{where}.{key}", errors, unknown)


def _scalar_problem(value: Any, go_type: str) -> str:
    if go_type == "interface{}":
        return ""
    if go_type in ("string", "StopReason"):
        return "" if isinstance(value, str) else "not a string"
    if go_type == "bool":
        return "" if isinstance(value, bool) else "not a boolean"
    if go_type == "float64":
        return "" if isinstance(value, int | float) and not isinstance(value, bool) else "not a number"
    if go_type in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            return "not a whole number"
        low, high = _INT_RANGES[go_type]
        return "" if low <= value <= high else "out of range"
    if go_type == "time.Time":
        return "" if isinstance(value, str) and _RFC3339.fullmatch(value) else "not RFC 3339"
    raise AssertionError(f"no rule for Go type {go_type}")
