"""Renders the committed monitoring artifacts and tells which of them drifted from the generator.

Outputs: one Grafana dashboard JSON per dashboard module under deploy/dashboards/ (kustomize turns
them into ConfigMaps labelled `grafana_dashboard: "1"`), and deploy/monitoring/prometheusrule.yaml.
"""

from __future__ import annotations

from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from tools.dashboards import cache, fleet_overview, prometheus_rule, trigger_router

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO_ROOT / "deploy" / "dashboards"
MONITORING_DIR = REPO_ROOT / "deploy" / "monitoring"
RULES_FILE = MONITORING_DIR / "rules.yaml"
PROMETHEUS_RULE_FILE = MONITORING_DIR / "prometheusrule.yaml"

DASHBOARD_MODULES = (fleet_overview, cache, trigger_router)


def dashboard_path(uid: str) -> Path:
    return DASHBOARD_DIR / f"{uid}.json"


def render() -> dict[Path, str]:
    """Every generated file's path and its exact content."""
    encoder = JSONEncoder(sort_keys=True, indent=2)
    outputs = {
        dashboard_path(module.UID): encoder.encode(module.build()) + "\n" for module in DASHBOARD_MODULES
    }
    outputs[PROMETHEUS_RULE_FILE] = prometheus_rule.render(RULES_FILE)
    return outputs


def stale(outputs: dict[Path, str]) -> list[Path]:
    """The generated files that are missing or differ from what the generator renders."""
    return [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]


def write(outputs: dict[Path, str]) -> list[Path]:
    """Writes the stale files and returns them."""
    changed = stale(outputs)
    for path in changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(outputs[path])
    return changed
