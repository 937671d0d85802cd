"""The recording rules and alerts pass `promtool check rules` and their `promtool test rules` unit tests.

promtool comes with Debian's `prometheus` package, which `make test` installs (tools/install-system-tools.sh);
without it these tests fail rather than skip, since the rules would otherwise go unchecked.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tools.dashboards.generate import MONITORING_DIR, RULES_FILE

RULE_TESTS = MONITORING_DIR / "rules_test.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: tools/install-system-tools.sh (run by `make test`) installs it"
    return path


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_every_rule(promtool):
    done = subprocess.run([promtool, "check", "rules", str(RULES_FILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_unit_tests_pass(promtool):
    done = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)], cwd=MONITORING_DIR, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_catch_a_wrong_expectation(promtool, tmp_path):
    """The unit tests compare real values: the same tests against a rule with another threshold fail."""
    threshold = 'relaygr:kv_cache_utilization:ratio{tier="hbm"} > 0.9'
    assert threshold in RULES_FILE.read_text()
    (tmp_path / "rules.yaml").write_text(RULES_FILE.read_text().replace(threshold, threshold + "6"))
    (tmp_path / "rules_test.yaml").write_text(RULE_TESTS.read_text())
    done = subprocess.run(
        [promtool, "test", "rules", "rules_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode != 0 and "RelayGRHbmTierNearCapacity" in done.stdout + done.stderr


def test_every_alert_is_shown_firing_by_a_unit_test():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        case["alertname"] for test in tests for case in test.get("alert_rule_test", []) if case["exp_alerts"]
    }
    assert firing == {rule["alert"] for rule in rules() if "alert" in rule}


def test_alerts_carry_severity_and_explanations():
    for rule in (r for r in rules() if "alert" in r):
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]
        assert re.fullmatch(r"\d+m", rule["for"]), rule["alert"]


def test_recording_rules_follow_the_naming_convention():
    """level:metric:operations, with the fleet's `relaygr` level."""
    for rule in (r for r in rules() if "record" in r):
        assert re.fullmatch(r"relaygr:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


SLO_RULES = (
    "relaygr:rank_handling_seconds:p50_5m",
    "relaygr:rank_handling_seconds:p99_5m",
    "relaygr:rank_slo_compliance:ratio_rate5m",
)


def test_rank_slo_rules_read_the_rankers_handling_of_every_rank():
    """Every Rank ends on a ranker, whichever process routed it (the retrieval stubs route their own, only
    external callers go through the router): the SLO rules read the rankers' Rank histogram, and the SLO
    alert reads them."""
    by_name = {rule.get("record", rule.get("alert")): rule for rule in rules()}
    for name in SLO_RULES:
        expr = by_name[name]["expr"]
        assert 'job="ranker", grpc_method="Rank"' in expr and "router" not in expr, name
        assert re.search(r"grpc_server_handling_seconds_(bucket|count)\{", expr), name
    assert by_name["RelayGRRankP99OverSLO"]["expr"] == "relaygr:rank_handling_seconds:p99_5m > 0.05"


def test_promtool_unit_tests_catch_an_slo_read_through_the_router(promtool, tmp_path):
    """The unit tests' router series (external callers' Ranks, all slow) would change every SLO value and
    fire the alert in the quiet case: the SLO rules reading the router instead of the rankers fail them."""
    ranker = 'job="ranker", grpc_method="Rank"'
    text = RULES_FILE.read_text()
    assert text.count(ranker) == 4
    (tmp_path / "rules.yaml").write_text(text.replace(ranker, 'job=~"ranker|router", grpc_method="Rank"'))
    (tmp_path / "rules_test.yaml").write_text(RULE_TESTS.read_text())
    done = subprocess.run(
        [promtool, "test", "rules", "rules_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    for name in (*SLO_RULES, "RelayGRRankP99OverSLO"):
        assert name in output, name


def test_unroutable_alert_reads_every_routing_process():
    """The trigger (PreInfer), the retrieval stub (Rank) and the router (external callers) each keep their
    own view of the rankers; a ranker is unroutable only when all of them have marked it."""
    alert = next(rule for rule in rules() if rule.get("alert") == "RelayGRRankerUnroutable")
    assert " ".join(alert["expr"].split()) == (
        "max by (namespace, member) ( "
        'relaygr_router_member_healthy{job=~"trigger|retrieval-stub|router"}) == 0'
    )
