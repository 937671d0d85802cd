"""One envelope around every command's results: each results.json (mlperf's result.json) is

    {"command": …, "started_at": …, "duration_s": …, "commit": …, "machine": …, "versions": …,
     "settings": …, "checks": …, "payload": {…}}

the same header whatever the command: which command ran, when and for how long, at which commit, on which
machine with which packages, with which settings, and what its checks found; then the command's own record,
its payload. A header field is null where a run did not record it (runs committed before the envelope).

A command's record names some header fields its own way (run's settings are its `configuration`, mlperf's
commit its `git_commit`): `FIELDS` maps each command's header fields to its record's keys, so `wrap` lifts
them out of a record and `unwrap` puts them back, and a record reads and writes as it always has. A command
whose record does not hold the commit, the machine or the packages passes them to `write`
(`bench.lib.context.provenance`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HEADER = ("command", "started_at", "duration_s", "commit", "machine", "versions", "settings", "checks")


def _same(*names: str) -> dict[str, str]:
    return {name: name for name in names}


# Per command: header field -> the key its record holds it under. Settings recorded as `configuration`; the
# commit and the duration under mlperf's and tracing's own names.
CONFIGURATION = {"settings": "configuration"}
OWN_NAMES = {"duration_s": "wall_s", "commit": "git_commit"}
FIELDS: dict[str, dict[str, str]] = {
    "run": {**_same("started_at", "duration_s", "machine", "versions", "checks"), **CONFIGURATION},
    "headline": _same("started_at", "duration_s", "commit", "machine", "versions", "settings"),
    "ab": _same("started_at", "duration_s", "machine", "versions", "settings"),
    "mlperf": {**_same("started_at"), **OWN_NAMES, **CONFIGURATION},
    "mlperf-run": {**_same("settings"), "duration_s": "wall_s"},  # one LoadGen run of mlperf's
    "tracing": {**_same("started_at", "machine"), **OWN_NAMES, **CONFIGURATION},
    "rollout": {**_same("started_at"), "commit": "git_commit", **CONFIGURATION},
    "serving": CONFIGURATION,
    "shared-device": CONFIGURATION,
    "accelerator": {},
}


def wrap(command: str, record: dict[str, Any], **header: Any) -> dict[str, Any]:
    """`record` in its envelope: the header fields its command's record holds lifted out (`FIELDS`; null
    where it lacks one), the others from `header` (null where it does not give one), the rest of it the
    payload."""
    fields = FIELDS[command]
    unknown = set(header) - set(HEADER)
    if unknown:
        raise ValueError(f"not header fields: {', '.join(sorted(unknown))}")
    lifted = set(fields.values())
    envelope = {name: header.get(name) for name in HEADER}
    envelope["command"] = command
    for name, key in fields.items():
        envelope[name] = record.get(key)
    envelope["payload"] = {key: value for key, value in record.items() if key not in lifted}
    return envelope


def unwrap(envelope: dict[str, Any], command: str, where: str = "results") -> dict[str, Any]:
    """The record of `command` that `envelope` holds, its header fields put back under the record's keys
    (but null ones, which it did not hold); a ValueError naming `where` and the field for anything else."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("payload"), dict):
        raise ValueError(f"{where}: no envelope (an object with a payload object)")
    if envelope.get("command") != command:
        raise ValueError(f"{where}: command is {envelope.get('command')!r}, not {command!r}")
    missing = [name for name in HEADER if name not in envelope]
    if missing:
        raise ValueError(f"{where}: the envelope lacks {', '.join(missing)}")
    record = dict(envelope["payload"])
    for name, key in FIELDS[command].items():
        if envelope[name] is not None:  # null: the record did not hold it
            record[key] = envelope[name]
    return record


def dumps(envelope: dict[str, Any]) -> str:
    return json.dumps(envelope, indent=1) + "\n"


def write(path: Path, command: str, record: dict[str, Any], **header: Any) -> None:
    """Writes `record` in its envelope (`wrap`); `bench.lib.context.provenance()` is the header a command
    passes for the commit, machine and packages its record does not hold."""
    path.write_text(dumps(wrap(command, record, **header)))


def command_of(path: Path) -> str | None:
    """The command whose results `path` holds (None: not an envelope)."""
    data = json.loads(path.read_text())
    return data.get("command") if isinstance(data, dict) and "payload" in data else None


def read(path: Path, command: str) -> dict[str, Any]:
    """The record of `command` at `path`, out of its envelope (`unwrap`)."""
    return unwrap(json.loads(path.read_text()), command, str(path))
