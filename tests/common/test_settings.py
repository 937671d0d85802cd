"""The settings two services share are one declaration each, read alike by both."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.config import load
from services.common.settings import RelaySettings, RequestLimits
from services.ranker.config import RankerConfig
from services.retrieval_stub.config import RetrievalStubConfig
from services.trigger.config import TriggerConfig


def declared(cls: type, name: str) -> dataclasses.Field:
    return {field.name: field for field in dataclasses.fields(cls)}[name]


def test_the_relay_window_is_one_setting_of_the_trigger_and_the_retrieval_stub() -> None:
    shared = declared(RelaySettings, "relay_window_ms")
    assert declared(TriggerConfig, "relay_window_ms") is shared
    assert declared(RetrievalStubConfig, "relay_window_ms") is shared
    environ = {"RELAYGR_RELAY_WINDOW_MS": "45"}
    assert load(TriggerConfig, [], environ).relay_window_ms == 45.0
    assert load(RetrievalStubConfig, [], environ).relay_window_ms == 45.0
    assert load(RetrievalStubConfig, ["--relay-window-ms", "12.5"], environ).relay_window_ms == 12.5
    assert TriggerConfig().relay_window_ms == RetrievalStubConfig().relay_window_ms == 30.0


def test_the_trigger_places_against_the_window_only_where_it_routes_pre_infer_itself() -> None:
    direct = load(TriggerConfig, ["--rankers", "ranker-0=127.0.0.1:1", "--relay-window-ms", "45"], {})
    assert direct.placement_window_ms == 45.0
    through_router = load(TriggerConfig, ["--relay-window-ms", "45"], {})
    assert (through_router.relay_window_ms, through_router.placement_window_ms) == (45.0, 0.0)


@pytest.mark.parametrize("cls", [TriggerConfig, RetrievalStubConfig])
def test_a_negative_relay_window_is_refused_naming_the_flag(cls: type, capsys) -> None:
    with pytest.raises(SystemExit):
        load(cls, ["--relay-window-ms", "-1"], {})
    assert "--relay-window-ms must not be negative" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load(cls, ["--preprocess-delay-ms", "10"], {})  # the stub's old flag is gone, not an alias


@pytest.mark.parametrize("name", ["max_long_term_events", "max_short_term_events", "max_candidates"])
def test_the_request_limits_are_one_declaration_of_the_trigger_and_the_ranker(name: str) -> None:
    shared = declared(RequestLimits, name)
    assert declared(TriggerConfig, name) is shared and declared(RankerConfig, name) is shared
    assert getattr(TriggerConfig(), name) == getattr(RankerConfig(), name) == shared.default


def test_one_variable_sets_a_limit_in_the_trigger_and_the_ranker_alike() -> None:
    environ = {"RELAYGR_MAX_CANDIDATES": "64", "RELAYGR_MAX_LONG_TERM_EVENTS": "2048"}
    trigger, ranker = load(TriggerConfig, [], environ), load(RankerConfig, [], environ)
    assert (trigger.max_candidates, trigger.max_long_term_events) == (64, 2048)
    assert (ranker.max_candidates, ranker.max_long_term_events) == (64, 2048)
    assert trigger.max_short_term_events == ranker.max_short_term_events == 512
