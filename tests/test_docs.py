"""The README's configuration tables are generated from the settings classes and must be current."""

from tools import docs


def test_readme_configuration_tables_are_current():
    text = docs.README.read_text()
    assert docs.update(text) == text, "README is stale: run `python -m tools.docs`"
