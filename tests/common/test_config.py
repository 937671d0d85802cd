"""Every setting is a flag with a RELAYGR_ environment twin; flags beat the environment."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.config import env_name, flag_name, load, markdown_table, setting
from services.common.server import ServiceConfig
from services.ranker.config import RankerConfig


@dataclasses.dataclass(frozen=True)
class Example(ServiceConfig):
    budget_mb: float = setting(1.5, "a budget")
    enabled: bool = setting(False, "a switch")
    name: str = setting("x", "a name")


def test_defaults_then_environment_then_flags():
    assert load(Example, [], {}).budget_mb == 1.5
    from_env = load(Example, [], {"RELAYGR_BUDGET_MB": "3", "RELAYGR_ENABLED": "true", "RELAYGR_NAME": "e"})
    assert (from_env.budget_mb, from_env.enabled, from_env.name) == (3.0, True, "e")
    from_flag = load(Example, ["--budget-mb", "4", "--enabled", "no"], {"RELAYGR_BUDGET_MB": "3"})
    assert (from_flag.budget_mb, from_flag.enabled) == (4.0, False)


def test_bad_environment_value_names_the_variable(capsys):
    with pytest.raises(SystemExit):
        load(Example, [], {"RELAYGR_BUDGET_MB": "lots"})
    assert "RELAYGR_BUDGET_MB" in capsys.readouterr().err


def test_validation_errors_name_the_flag(capsys):
    with pytest.raises(SystemExit):
        load(RankerConfig, ["--hbm-budget-mb", "-1"], {})
    assert "--hbm-budget-mb" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load(RankerConfig, ["--tls-cert", "a.pem"], {})
    assert "--tls-key" in capsys.readouterr().err


def test_markdown_table_documents_every_field():
    table = markdown_table(RankerConfig)
    for field in dataclasses.fields(RankerConfig):
        assert f"`{flag_name(field.name)}`" in table
        assert f"`{env_name(field.name)}`" in table
