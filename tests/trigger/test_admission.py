"""AdmissionPolicy, driven by a fake clock: the at-risk rule, both bounds, duplicates and refunds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.trigger.admission import AdmissionLimits, AdmissionPolicy, Reason, TokenBucket
from services.trigger.cost_model import CostModel

KV_BYTES_PER_TOKEN = 1024
WINDOW_S = 3.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_policy(
    clock: FakeClock,
    budget_bytes: int = 10**9,
    tokens_per_s: float = 1e9,
    burst: float = 1e9,
    threshold_ms: float = 25.0,
) -> AdmissionPolicy:
    policy = AdmissionPolicy(AdmissionLimits(threshold_ms, budget_bytes, WINDOW_S), clock)
    policy.set_load_limit(tokens_per_s, burst)
    return policy


def decide(policy: AdmissionPolicy, key: str, tokens: int, predicted_ms: float = 40.0):
    footprint = tokens * KV_BYTES_PER_TOKEN
    return policy.decide(key, tokens=tokens, footprint_bytes=footprint, predicted_ms=predicted_ms)


def test_refuses_short_histories_and_admits_long_ones():
    # Calibrated as a CPU ranker might be: the SLO's risk threshold falls between 1k and 8k events.
    model = CostModel(fixed_ms=1.0, per_token_ms=1e-3, per_pair_ms=5e-7)
    policy = make_policy(FakeClock(), threshold_ms=25.0)
    short = decide(policy, "short", 1000, model.predict_ms(1000, 16, 128))
    long = decide(policy, "long", 8192, model.predict_ms(8192, 16, 128))
    assert (short.reason, short.admitted) == (Reason.NOT_AT_RISK, False)
    assert (long.reason, long.admitted) == (Reason.ADMITTED, True)
    assert policy.footprint_bytes == 8192 * KV_BYTES_PER_TOKEN


def test_footprint_bound_refuses_until_the_window_has_passed():
    clock = FakeClock()
    policy = make_policy(clock, budget_bytes=1000 * KV_BYTES_PER_TOKEN)
    assert decide(policy, "a", 400).admitted
    clock.advance(1.0)
    assert decide(policy, "b", 400).admitted
    assert decide(policy, "c", 400).reason is Reason.FOOTPRINT_LIMIT
    assert decide(policy, "small", 200).admitted  # exactly fills the budget
    clock.advance(WINDOW_S - 1.0)  # "a" leaves the window
    assert policy.footprint_bytes == 600 * KV_BYTES_PER_TOKEN
    assert decide(policy, "c", 400).admitted
    assert policy.footprint_bytes == 1000 * KV_BYTES_PER_TOKEN


def test_a_prefix_larger_than_the_budget_is_never_admitted():
    policy = make_policy(FakeClock(), budget_bytes=100 * KV_BYTES_PER_TOKEN)
    assert decide(policy, "huge", 101).reason is Reason.FOOTPRINT_LIMIT
    assert policy.footprint_bytes == 0


def test_token_bucket_refuses_when_empty_and_refills_over_time():
    clock = FakeClock()
    policy = make_policy(clock, tokens_per_s=100.0, burst=100.0)
    assert decide(policy, "a", 80).admitted
    assert decide(policy, "b", 80).reason is Reason.LOAD_LIMIT
    assert policy.tokens_available == pytest.approx(20.0)
    clock.advance(0.5)
    assert decide(policy, "b", 80).reason is Reason.LOAD_LIMIT  # 70 tokens
    clock.advance(0.25)
    assert decide(policy, "b", 80).admitted  # 95 tokens
    assert policy.tokens_available == pytest.approx(15.0)
    clock.advance(10.0)
    assert policy.tokens_available == pytest.approx(100.0)  # capped at the burst


def test_refusals_reserve_neither_bytes_nor_tokens():
    clock = FakeClock()
    policy = make_policy(clock, budget_bytes=500 * KV_BYTES_PER_TOKEN, tokens_per_s=1.0, burst=600.0)
    assert decide(policy, "a", 400).admitted
    tokens_before = policy.tokens_available
    assert decide(policy, "b", 200).reason is Reason.FOOTPRINT_LIMIT
    assert decide(policy, "c", 10, predicted_ms=1.0).reason is Reason.NOT_AT_RISK
    assert policy.tokens_available == pytest.approx(tokens_before)
    assert decide(policy, "d", 100).admitted  # bytes 500/500, tokens 100 left
    clock.advance(WINDOW_S)  # bytes free again, only ~3 tokens refilled
    assert decide(policy, "e", 150).reason is Reason.LOAD_LIMIT
    assert policy.footprint_bytes == 0


def test_duplicates_within_the_window_return_the_remembered_instance():
    clock = FakeClock()
    policy = make_policy(clock)
    assert decide(policy, "user-1/prefix-A", 500).admitted
    assert decide(policy, "user-1/prefix-A", 500).relay_instance == ""  # its PreInfer is still unanswered
    policy.confirm("user-1/prefix-A", "ranker-2", computed=True)
    clock.advance(WINDOW_S - 0.01)
    again = decide(policy, "user-1/prefix-A", 500)
    assert (again.reason, again.admitted, again.relay_instance) == (Reason.DUPLICATE, False, "ranker-2")
    assert decide(policy, "user-1/prefix-B", 501).admitted  # the user acted since: a new prefix
    clock.advance(0.01)
    assert decide(policy, "user-1/prefix-A", 500).admitted
    assert policy.footprint_bytes == (500 + 501) * KV_BYTES_PER_TOKEN


def test_cancel_refunds_bytes_tokens_and_the_duplicate_record():
    clock = FakeClock()
    policy = make_policy(clock, budget_bytes=1000 * KV_BYTES_PER_TOKEN, tokens_per_s=1.0, burst=1000.0)
    assert decide(policy, "a", 900).admitted
    assert decide(policy, "b", 900).reason is Reason.FOOTPRINT_LIMIT
    policy.cancel("a")  # the ranker refused it
    assert policy.footprint_bytes == 0
    assert policy.tokens_available == pytest.approx(1000.0)
    assert decide(policy, "a", 900).admitted  # no longer a duplicate


def test_a_prefix_the_ranker_did_not_compute_returns_its_tokens_but_keeps_its_bytes():
    policy = make_policy(FakeClock(), tokens_per_s=1.0, burst=1000.0)
    assert decide(policy, "a", 700).admitted
    policy.confirm("a", "ranker-0", computed=False)  # ALREADY_CACHED: leased in HBM, nothing computed
    assert policy.tokens_available == pytest.approx(1000.0)
    assert policy.footprint_bytes == 700 * KV_BYTES_PER_TOKEN
    assert decide(policy, "a", 700).relay_instance == "ranker-0"


def test_no_load_is_admitted_before_a_load_limit_is_set():
    policy = AdmissionPolicy(AdmissionLimits(25.0, 10**9, WINDOW_S), FakeClock())
    assert decide(policy, "a", 1).reason is Reason.LOAD_LIMIT


def test_resizing_the_bucket_keeps_its_deficit():
    bucket = TokenBucket(rate=10.0, burst=100.0, now=0.0)
    assert bucket.take(70, now=0.0)
    bucket.resize(rate=20.0, burst=200.0, now=0.0)
    assert bucket.level(now=0.0) == pytest.approx(130.0)
    bucket.resize(rate=20.0, burst=50.0, now=0.0)
    assert bucket.level(now=0.0) == pytest.approx(0.0)
    assert bucket.level(now=1.0) == pytest.approx(20.0)


operations = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=2.0),  # time since the previous operation, s
        st.integers(min_value=0, max_value=7),  # key (small, so duplicates happen)
        st.integers(min_value=1, max_value=600),  # tokens
        st.booleans(),  # whether the ranker refuses it
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations, st.integers(min_value=0, max_value=2000))
def test_admitted_footprint_in_any_window_never_exceeds_the_budget(ops, budget_tokens):
    clock = FakeClock()
    budget = budget_tokens * KV_BYTES_PER_TOKEN
    policy = make_policy(clock, budget_bytes=budget, tokens_per_s=300.0, burst=900.0)
    admitted: dict[int, tuple[float, int]] = {}  # admission id -> (time, bytes), refunds removed
    for index, (dt, key, tokens, refused) in enumerate(ops):
        clock.advance(dt)
        decision = decide(policy, key, tokens)
        if not decision.admitted:
            continue
        admitted[index] = (clock.now, tokens * KV_BYTES_PER_TOKEN)
        if refused:
            policy.cancel(key)
            del admitted[index]
        in_window = sum(size for at, size in admitted.values() if at + WINDOW_S > clock.now)
        assert in_window <= budget
        assert policy.footprint_bytes == in_window
