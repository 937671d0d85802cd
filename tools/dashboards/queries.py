"""Every PromQL query the committed dashboards and recording rules run, as one machine-readable list.

The live monitoring test starts a real Prometheus over a local fleet under load and asserts that each
of these returns data; the live exemplar test, that Prometheus holds trace-id exemplars for each target
that asks for them (`exemplar_queries`). Queries are read from the committed files (what Grafana and
Prometheus load), not from the generator; the drift check keeps the two equal.

Dashboard queries keep their Grafana variables (`$namespace`, `$pod`, `$slo`, `$__rate_interval`);
`expand()` substitutes values for them. A `label_values(selector, label)` variable query becomes
`count by (label) (selector)`, which returns data exactly when the variable would have values.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tools.dashboards.generate import DASHBOARD_DIR, RULES_FILE

_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclasses.dataclass(frozen=True)
class Query:
    """A PromQL expression and where it is used, e.g. `relaygr-cache: Entries per tier [A]`."""

    source: str
    expr: str


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # collapsed rows nest their panels


def dashboard_queries(board: dict[str, Any]) -> list[Query]:
    uid = board["uid"]
    found = []
    for variable in board.get("templating", {}).get("list", []):
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["query"])
        if match is None:
            raise ValueError(f"{uid}: variable {variable['name']} is not a label_values() query")
        expr = f"count by ({match['label']}) ({match['selector']})"
        found.append(Query(f"{uid}: variable {variable['name']}", expr))
    for panel in _panels(board["panels"]):
        for target in panel.get("targets", []):
            found.append(Query(f"{uid}: {panel['title']} [{target['refId']}]", target["expr"]))
    return found


def recording_rule_queries(rules: dict[str, Any]) -> list[Query]:
    """Each recording rule's own expression, and a query of the series it records."""
    found = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                found.append(Query(f"rule {rule['record']}: expression", rule["expr"]))
                found.append(Query(f"rule {rule['record']}: recorded series", rule["record"]))
    return found


def all_queries(dashboard_dir: Path = DASHBOARD_DIR, rules_file: Path = RULES_FILE) -> list[Query]:
    found = []
    for path in sorted(dashboard_dir.glob("*.json")):
        found.extend(dashboard_queries(json.loads(path.read_text())))
    found.extend(recording_rule_queries(yaml.safe_load(rules_file.read_text())))
    return found


def exemplar_queries(dashboard_dir: Path = DASHBOARD_DIR) -> list[Query]:
    """The dashboard targets that also ask for exemplars (`exemplar: true`): Grafana sends each one's
    expression to Prometheus' /api/v1/query_exemplars and draws the trace ids it gets back."""
    found = []
    for path in sorted(dashboard_dir.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in _panels(board["panels"]):
            for target in panel.get("targets", []):
                if target.get("exemplar"):
                    found.append(
                        Query(f"{board['uid']}: {panel['title']} [{target['refId']}]", target["expr"])
                    )
    return found


def expand(expr: str, values: Mapping[str, str]) -> str:
    """`expr` with each `$name` or `${name}` replaced by `values[name]`; an unknown name raises KeyError."""
    return _VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], expr)
