"""The configuration page's tables are generated from the settings classes and must be current."""

from tools import docs


def test_configuration_tables_are_current():
    text = docs.CONFIGURATION.read_text()
    assert docs.update(text) == text, "docs/configuration.md is stale: run `python -m tools.docs`"
