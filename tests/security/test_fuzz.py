"""Every RPC of the fleet, fuzzed: bad input is INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for size) with a
message that names the field, never UNKNOWN or INTERNAL, never a crash, and every service stays healthy.

One fleet (ranker, router, trigger, retrieval stub as processes on loopback, each accepting messages of at
most 1 MiB) serves every test. Requests are built by hypothesis: well-formed messages with hostile values
(unequal arrays, huge and negative numbers, empty and long sequences, any unicode in ids), messages with
fields missing, invalid UTF-8 where a string belongs, arbitrary bytes, and messages over the size limit.
Calls go through generic (bytes in, bytes out) stubs, so anything can be sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaygr.v1 import common_pb2, ranker_pb2, recommend_pb2, trigger_pb2
from services.common.contract import RANKER_SERVICE, RECOMMEND_SERVICE, TRIGGER_SERVICE
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet
from services.launcher.procs import health_status
from tests.reliability.harness import fleet_config
from tests.support.metrics import scrape, total

MAX_MESSAGE_MB = 1
LIMITS = "--max-long-term-events 512 --max-short-term-events 64 --max-candidates 64"
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
# InvalidArgument(field, problem) says "field: problem"; a message that does not parse names "request".
USEFUL = re.compile(r"^[a-z_]+(\.[a-z_]+)*: \S")
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
SMALL_OR_HOSTILE = st.one_of(st.integers(0, 7), INT32)
# Any text protobuf can carry (lone surrogates cannot be encoded as UTF-8), short or long.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)


@st.composite
def sequences(draw) -> common_pb2.BehaviorSequence:
    """Arrays of independent, possibly unequal lengths, with values anywhere in their types' ranges."""
    n = draw(st.integers(0, 600))
    same = draw(st.booleans())
    item_ids = draw(st.lists(st.one_of(st.integers(0, 10**6), INT64), min_size=n, max_size=n))
    actions = draw(st.lists(SMALL_OR_HOSTILE, min_size=n, max_size=n) if same else st.lists(SMALL_OR_HOSTILE))
    timestamps = draw(
        st.one_of(st.just([]), st.lists(INT64, min_size=n, max_size=n) if same else st.lists(INT64))
    )
    return common_pb2.BehaviorSequence(item_ids=item_ids, action_types=actions, timestamps_ms=timestamps)


def optional(strategy):
    """The value, or the field left out."""
    return st.one_of(st.none(), strategy)


def message(cls, **fields):
    """A message of `cls` with the drawn fields; None leaves a field unset (missing)."""
    return st.fixed_dictionaries(fields).map(
        lambda drawn: cls(**{k: v for k, v in drawn.items() if v is not None}).SerializeToString()
    )


PRE_INFER = message(ranker_pb2.PreInferRequest, user_id=optional(TEXT), long_term=optional(sequences()))
# A batch of such PreInfers, empty or over the limit at times.
PRE_INFER_BATCH = st.lists(PRE_INFER, max_size=5).map(
    lambda entries: ranker_pb2.PreInferBatchRequest(
        requests=[ranker_pb2.PreInferRequest.FromString(entry) for entry in entries]
    ).SerializeToString()
)
RANK = message(
    ranker_pb2.RankRequest,
    user_id=optional(TEXT),
    request_id=optional(TEXT),
    long_term=optional(sequences()),
    short_term=optional(sequences()),
    candidate_item_ids=optional(st.lists(INT64, max_size=100)),
    relay_instance=optional(TEXT),
)
ADMIT = message(
    trigger_pb2.AdmitRequest,
    user_id=optional(TEXT),
    long_term=optional(sequences()),
    num_candidates=optional(INT32),
    short_term_length=optional(INT32),
)
RECOMMEND = message(recommend_pb2.RecommendRequest, user_id=optional(TEXT), top_k=optional(INT32))

PRE_INFER_METHOD = f"/{RANKER_SERVICE}/PreInfer"
PRE_INFER_BATCH_METHOD = f"/{RANKER_SERVICE}/PreInferBatch"
RANK_METHOD = f"/{RANKER_SERVICE}/Rank"
GET_PROFILE_METHOD = f"/{RANKER_SERVICE}/GetProfile"
ADMIT_METHOD = f"/{TRIGGER_SERVICE}/Admit"
RECOMMEND_METHOD = f"/{RECOMMEND_SERVICE}/Recommend"

# (target service, full method, strategy of well-formed requests)
RPCS = [
    ("ranker-0", PRE_INFER_METHOD, PRE_INFER),
    ("ranker-0", PRE_INFER_BATCH_METHOD, PRE_INFER_BATCH),
    ("ranker-0", RANK_METHOD, RANK),
    ("ranker-0", GET_PROFILE_METHOD, st.just(b"")),
    (ROUTER, PRE_INFER_METHOD, PRE_INFER),
    (ROUTER, RANK_METHOD, RANK),
    (ROUTER, GET_PROFILE_METHOD, st.just(b"")),
    (TRIGGER, ADMIT_METHOD, ADMIT),
    (STUB, RECOMMEND_METHOD, RECOMMEND),
]
RPC_IDS = [f"{target}:{method.rsplit('/', 1)[1]}" for target, method, _ in RPCS]
KEYED = [
    pytest.param(*rpc, id=name)
    for rpc, name in zip(RPCS, RPC_IDS, strict=True)
    if rpc[1] not in (GET_PROFILE_METHOD, PRE_INFER_BATCH_METHOD)  # their field 1 is no user_id
]
HEALTH_NAMES = {
    "ranker-0": RANKER_SERVICE,
    ROUTER: RANKER_SERVICE,
    TRIGGER: TRIGGER_SERVICE,
    STUB: RECOMMEND_SERVICE,
}


class Caller:
    """Generic bytes-in, bytes-out calls to the fleet's services."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        # The client may send more than the servers accept: the servers must refuse it themselves.
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        self.channels = {name: grpc.insecure_channel(fleet.address(name), options) for name in HEALTH_NAMES}

    def __call__(self, target: str, method: str, request: bytes) -> tuple[grpc.StatusCode, str]:
        call = self.channels[target].unary_unary(method)
        try:
            call(request, timeout=30)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


@pytest.fixture(scope="module")
def caller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Caller]:
    limit = f"--max-message-mb {MAX_MESSAGE_MB}"
    config = fleet_config(
        tmp_path_factory.mktemp("logs"),
        rankers=1,
        ranker_args=f"--profile-lengths 32,128 --profile-repeats 1 --drain-min-s 0 --max-pre-infer-batch 4 "
        f"{LIMITS} {limit}",
        router_args=f"--health-interval-s 0.2 {limit}",
        trigger_args=f"--profile-retry-s 0.2 {LIMITS} {limit}",
        stub_args=f"--history-min 20 --history-median 64 --history-max 256 --num-candidates 16 "
        f"--relay-window-ms 0 {limit}",
    )
    with Fleet(config) as fleet:
        calls = Caller(fleet)
        yield calls
        calls.close()
        # Nothing that any test sent made a service answer UNKNOWN or INTERNAL, or die.
        for name, child in fleet.children.items():
            samples = scrape(child.metrics_port)
            for code in ("UNKNOWN", "INTERNAL"):
                assert total(samples, "grpc_server_handled_total", grpc_code=code) == 0, (name, code)
        fleet.check()


def assert_refused_usefully(code: grpc.StatusCode, details: str) -> None:
    assert code in ALLOWED, (code, details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert USEFUL.match(details), details


def assert_healthy(caller: Caller) -> None:
    caller.fleet.check()
    for name, service in HEALTH_NAMES.items():
        status = health_status(caller.fleet.address(name), service)
        assert status == health_pb2.HealthCheckResponse.SERVING, name


@pytest.mark.parametrize(("target", "method", "requests"), RPCS, ids=RPC_IDS)
def test_hostile_values_and_missing_fields_are_refused_usefully(caller, target, method, requests):
    @FUZZ
    @given(request=requests)
    def check(request: bytes) -> None:
        assert_refused_usefully(*caller(target, method, request))

    check()
    assert_healthy(caller)


@pytest.mark.parametrize(("target", "method", "requests"), RPCS, ids=RPC_IDS)
def test_arbitrary_bytes_are_refused_with_a_useful_message(caller, target, method, requests):
    @FUZZ
    @given(request=st.binary(max_size=2000))
    def check(request: bytes) -> None:
        assert_refused_usefully(*caller(target, method, request))

    check()
    assert_healthy(caller)


def invalid_utf8_user_id(payload: bytes) -> bytes:
    """Field 1 (user_id in every request that has one) holding bytes that are not UTF-8."""
    return b"\x0a" + bytes([len(payload)]) + payload


@pytest.mark.parametrize(("target", "method", "requests"), KEYED)
def test_a_user_id_that_is_not_utf8_is_invalid_argument(caller, target, method, requests):
    code, details = caller(target, method, invalid_utf8_user_id(b"user-\xff\xfe\xc0"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("request: is not a valid protobuf message"), details


@pytest.mark.parametrize(("target", "method", "requests"), RPCS, ids=RPC_IDS)
def test_a_message_over_the_size_limit_is_resource_exhausted(caller, target, method, requests):
    oversized = ranker_pb2.PreInferRequest(
        user_id="big", long_term=common_pb2.BehaviorSequence(item_ids=[2**40] * 200_000)
    ).SerializeToString()
    assert len(oversized) > MAX_MESSAGE_MB * 1024 * 1024
    code, details = caller(target, method, oversized)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert "larger than max" in details
    assert_healthy(caller)


def rank(**fields) -> ranker_pb2.RankRequest:
    """A valid Rank but for `fields`."""
    long_term = common_pb2.BehaviorSequence(item_ids=[1, 2], action_types=[0, 1])
    return ranker_pb2.RankRequest(user_id="u", long_term=long_term, candidate_item_ids=[3], **fields)


@pytest.mark.parametrize(
    ("target", "method", "request_", "field"),
    [
        pytest.param("ranker-0", PRE_INFER_METHOD, ranker_pb2.PreInferRequest(), "user_id", id="no-user"),
        pytest.param(
            "ranker-0",
            PRE_INFER_BATCH_METHOD,
            ranker_pb2.PreInferBatchRequest(),
            "requests",
            id="empty-batch",
        ),
        pytest.param(ROUTER, RANK_METHOD, ranker_pb2.RankRequest(), "user_id", id="empty-rank"),
        pytest.param(TRIGGER, ADMIT_METHOD, trigger_pb2.AdmitRequest(), "user_id", id="empty-admit"),
        pytest.param(STUB, RECOMMEND_METHOD, recommend_pb2.RecommendRequest(), "user_id", id="empty-stub"),
        pytest.param(
            ROUTER,
            RANK_METHOD,
            ranker_pb2.RankRequest(user_id="u", long_term=common_pb2.BehaviorSequence(item_ids=[1] * 513)),
            "long_term.item_ids",
            id="history-over-the-limit",
        ),
        pytest.param(
            ROUTER,
            RANK_METHOD,
            ranker_pb2.RankRequest(
                user_id="u", long_term=common_pb2.BehaviorSequence(item_ids=[1, 2], action_types=[1])
            ),
            "long_term.action_types",
            id="unequal-arrays",
        ),
        pytest.param(
            STUB, RECOMMEND_METHOD, recommend_pb2.RecommendRequest(user_id="u", top_k=-3), "top_k", id="top-k"
        ),
        pytest.param(
            TRIGGER, ADMIT_METHOD, trigger_pb2.AdmitRequest(user_id="é" * 200), "user_id", id="long-user"
        ),
        pytest.param(
            ROUTER, RANK_METHOD, rank(request_id="r1\nINFO forged"), "request_id", id="request-id-newline"
        ),
        pytest.param("ranker-0", RANK_METHOD, rank(request_id="r" * 129), "request_id", id="long-request-id"),
        pytest.param(
            ROUTER, RANK_METHOD, rank(relay_instance="ranker-0\r\n"), "relay_instance", id="hint-crlf"
        ),
        pytest.param(
            "ranker-0", RANK_METHOD, rank(relay_instance="a" * 254), "relay_instance", id="long-hint"
        ),
        pytest.param(ROUTER, RANK_METHOD, rank(relay_instance="-x"), "relay_instance", id="hint-dash"),
    ],
)
def test_each_refusal_names_the_field_at_fault(caller, target, method, request_, field):
    code, details = caller(target, method, request_.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}: "), details
