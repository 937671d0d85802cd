"""Settings that more than one service reads, each declared once and included by every service that does
(the way `services.affinity.settings.AffinitySettings` is), so two services cannot drift apart on them.

- `RelaySettings`: the relay window, which the retrieval stub spends pre-processing and the trigger places
  pre-inference against;
- `RequestLimits`: the largest request accepted, which the trigger (Admit) and the ranker (PreInfer, Rank)
  enforce alike, so that what a trigger admits, the rankers with the same limits accept.
"""

from __future__ import annotations

import dataclasses

from services.common.config import setting


@dataclasses.dataclass(frozen=True)
class RelaySettings:
    """The relay window, read by the retrieval stub and the trigger.

    The stub's pre-processing (between its Admit and its Rank) takes `relay_window_ms`: the time the
    relay has to pre-infer a prefix before its Rank arrives. The trigger places each admitted prefix on
    a ranker that can have it ready within the same window (`services.trigger.config.TriggerConfig`'s
    `placement_window_ms`): where it routes directly; through a router, the router's ring places
    PreInfer and the trigger's placement window is 0. Give both services the same value (the launcher,
    deploy/ and bench/ do): a trigger with a longer window than its stubs moves prefixes to rankers that
    finish them after their Rank has come.
    """

    relay_window_ms: float = setting(
        30.0,
        "the relay window, ms from an Admit to its Rank: the retrieval stub's pre-processing time, against "
        "which the trigger places prefixes (0: each on its ring owner)",
        minimum=0,
    )


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """The largest request a service accepts, read by the trigger and the ranker; a request over one is
    refused INVALID_ARGUMENT naming its field. Give the triggers the rankers' values."""

    max_long_term_events: int = setting(
        8192, "longest long-term sequence accepted (an Admit's, a PreInfer's or a Rank's)", above=0
    )
    max_short_term_events: int = setting(
        512, "longest short-term sequence accepted (a Rank's; an Admit's short_term_length)", above=0
    )
    max_candidates: int = setting(
        1024, "most candidates one request may carry (a Rank's; an Admit's num_candidates)", above=0
    )
