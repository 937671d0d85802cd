"""Dataclasses to and from JSON, by their fields: how results.json is written and read (`bench.lib.schema`).

`to_json` writes a dataclass as an object of its fields in declaration order, nested dataclasses, lists,
tuples and dictionaries included. Field metadata changes that: `FLAT` writes a nested dataclass's fields
into the enclosing object, `OMIT_NONE` (`optional()`) leaves a field out while it is None, `TRANSIENT`
always (what a run keeps in memory only; read back, it has its default), and `omitted_while(value)` while
it holds `value`, which is also what it reads as where absent.

`from_json` reads one back by the field types: a key that a field without a default needs and the object
lacks, or a key that no field takes, is a ValueError naming where it is (`throughput_sweeps.<mix>.relay.
points.0 lacks cost`). A key named in the class's `RETIRED` (a setting or field whose mechanism is gone) is
read and dropped, so the committed files that record it still read; written back, they are the file less
those keys (`tests/bench/test_results.py`). Numbers, strings and booleans are taken as they are.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

FLAT = {"flat": True}
OMIT_NONE = {"omit_none": True}
TRANSIENT = {"transient": True}
schema = dataclasses.dataclass(kw_only=True)  # a results record


def optional() -> Any:
    """A field that defaults to None and is left out of results.json while it is None (older runs lack it)."""
    return dataclasses.field(default=None, metadata=OMIT_NONE)


def usually(value: Any) -> Any:
    """A field that defaults to `value` (a fresh one, for a list or a dict), reads as it where absent, and is
    left out of results.json while it holds it."""
    if isinstance(value, list | dict):
        return dataclasses.field(default_factory=type(value), metadata=omitted_while(value))
    return dataclasses.field(default=value, metadata=omitted_while(value))


def omitted_while(value: object) -> dict[str, object]:
    """A field's metadata: read as `value` where a results file lacks it, and left out while it holds it."""
    return {"absent": value, "omit_absent": True}


T = TypeVar("T")


def to_json(value: Any) -> Any:
    """A dataclass (or a list, tuple or dictionary of them) as JSON-able values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for field in dataclasses.fields(value):
            if field.metadata.get("transient"):
                continue
            item = getattr(value, field.name)
            if field.metadata.get("flat"):
                out.update(to_json(item))
            elif field.metadata.get("omit_absent") and item == field.metadata["absent"]:
                continue
            elif not (item is None and field.metadata.get("omit_none")):
                out[field.name] = to_json(item)
        return out
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    return value


def from_json(cls: type[T], data: Any, where: str = "") -> T:
    """An instance of the dataclass `cls` read from `data` (see the module's docstring)."""
    if not isinstance(data, dict):
        raise ValueError(f"results: {where or 'the top level'} is not an object")
    values, used = _fields_from(cls, data, where)
    retired = getattr(cls, "RETIRED", ())
    unknown = [key for key in data if key not in used and key not in retired]
    if unknown:
        raise ValueError(f"results: {where or 'the top level'} has unknown {', '.join(unknown)}")
    return cls(**values)


def _fields_from(cls: type, data: dict[str, Any], where: str) -> tuple[dict[str, Any], set[str]]:
    values: dict[str, Any] = {}
    used: set[str] = set()
    missing = []
    for field in dataclasses.fields(cls):
        if field.metadata.get("transient"):
            continue  # never written: its default applies
        hint = _hints(cls)[field.name]
        if field.metadata.get("flat"):
            nested, nested_used = _fields_from(hint, data, where)
            values[field.name] = hint(**nested)
            used |= nested_used
        elif field.name in data:
            values[field.name] = _decode(hint, data[field.name], f"{where}.{field.name}".lstrip("."))
            used.add(field.name)
        elif "absent" in field.metadata:  # left out while it held this value
            values[field.name] = field.metadata["absent"]
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            missing.append(field.name)
    if missing:
        raise ValueError(f"results: {where or 'the top level'} lacks {', '.join(missing)}")
    return values, used


def _decode(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [arg for arg in args if arg is not type(None)]
        return _decode(hint, value, where)
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value, where)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ValueError(f"results: {where} is not a list")
        items = [_decode(args[0], item, f"{where}.{number}") for number, item in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"results: {where} is not an object")
        return {key: _decode(args[1], item, f"{where}.{key}") for key, item in value.items()}
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)
