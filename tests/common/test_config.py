"""Every setting is a flag with a RELAYGR_ environment twin; flags beat the environment."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.config import ServiceConfig, env_name, flag_name, load, markdown_table, setting
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
        load(RankerConfig, ["--hbm-budget-mb", "-2"], {})  # -1 means auto
    assert "--hbm-budget-mb" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load(RankerConfig, ["--tls-cert", "a.pem"], {})
    assert "--tls-key" in capsys.readouterr().err


def test_markdown_table_documents_every_field():
    table = markdown_table(RankerConfig)
    for field in dataclasses.fields(RankerConfig):
        assert f"`{flag_name(field.name)}`" in table
        assert f"`{env_name(field.name)}`" in table


def _bounded_settings():
    from services.launcher.demo import LauncherConfig
    from services.ranker.convert import ConvertConfig
    from services.retrieval_stub.config import RetrievalStubConfig
    from services.router.config import RouterConfig
    from services.trigger.config import TriggerConfig

    commands = (RankerConfig, RouterConfig, TriggerConfig, RetrievalStubConfig, LauncherConfig, ConvertConfig)
    for cls in commands:
        for field in dataclasses.fields(cls):
            meta = field.metadata
            if meta.get("above") is not None or meta.get("minimum") is not None or meta.get("choices"):
                yield pytest.param(cls, field, id=f"{cls.__name__}.{field.name}")


@pytest.mark.parametrize("cls, field", list(_bounded_settings()))
def test_every_declared_bound_refuses_a_value_outside_it_naming_the_flag(cls, field, capsys):
    meta = field.metadata
    if meta["choices"]:
        bad, expected = "no-such-choice", "invalid choice"
    elif meta["above"] is not None:
        bad, expected = str(meta["above"]), "must be positive" if meta["above"] == 0 else "must be more than"
    else:
        bad, expected = str(meta["minimum"] - 1), "must not be negative"
    with pytest.raises(SystemExit):
        load(cls, [flag_name(field.name), bad], {})
    err = capsys.readouterr().err
    assert flag_name(field.name) in err and expected in err, err
    # A config built in code, not parsed, is held to the same bounds by its validate().
    if not meta["choices"]:
        with pytest.raises(ValueError, match=f"{flag_name(field.name)} {expected}"):
            dataclasses.replace(cls(), **{field.name: type(field.default)(bad)}).validate()


def test_choices_come_from_the_registries_they_name():
    from services.affinity.settings import ROUTING_POLICIES
    from services.ranker.cache.tiers import POLICIES
    from services.ranker.model.presets import PRESETS
    from services.router.config import RouterConfig

    fields = {f.name: f for f in dataclasses.fields(RankerConfig)}
    assert fields["model_preset"].metadata["choices"] == tuple(PRESETS)
    assert fields["dram_policy"].metadata["choices"] == tuple(POLICIES)
    routing = {f.name: f for f in dataclasses.fields(RouterConfig)}["routing_policy"]
    assert routing.metadata["choices"] == ROUTING_POLICIES
    assert load(RankerConfig, ["--dram-policy", "size"], {}).dram_policy == "size"


def test_host_dependent_defaults_are_resolved_before_validation(monkeypatch, capsys):
    """A ranker's --instance-name defaults to the host name (the StatefulSet pod's); that name, too, must
    be one a relay hint can carry, or the ranker refuses to start, naming the flag."""
    monkeypatch.setattr("socket.gethostname", lambda: "ranker-7")
    assert load(RankerConfig, [], {}).instance_name == "ranker-7"
    assert load(RankerConfig, ["--instance-name", "ranker-0"], {}).instance_name == "ranker-0"
    monkeypatch.setattr("socket.gethostname", lambda: "bad host\nname")
    with pytest.raises(SystemExit):
        load(RankerConfig, [], {})
    assert "--instance-name" in capsys.readouterr().err
