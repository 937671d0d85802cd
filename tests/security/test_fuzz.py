"""Every RPC of the fleet, fuzzed: bad input is INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for size) with a
message that names the field, never UNKNOWN or INTERNAL, never a crash, and every service stays healthy.

One fleet (ranker, router, trigger, retrieval stub as processes on loopback, each accepting messages of at
most 1 MiB) serves every test. Requests are built by hypothesis: well-formed messages with hostile values
(unequal arrays, huge and negative numbers, empty and long sequences, any unicode in ids), messages with
fields missing, invalid UTF-8 where a string belongs, arbitrary bytes, and messages over the size limit.
Calls go through generic (bytes in, bytes out) stubs, so anything can be sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from relaygr.v1 import common_pb2, handoff_pb2, ranker_pb2, recommend_pb2, trigger_pb2
from services.common import validation
from services.common.contract import HANDOFF_SERVICE, RANKER_SERVICE, RECOMMEND_SERVICE, TRIGGER_SERVICE
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet
from services.launcher.procs import health_status
from services.ranker.app import RankerApp
from services.ranker.cache import kv_wire
from services.ranker.handoff.receive import receive
from services.ranker.model.events import Events
from tests.ranker.handoff.support import made_up, stream
from tests.ranker.harness import BASE, held_bytes
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


# ---- The cache handoff, fuzzed on a ranker in this process, whose bytes are measured ----
#
# Push and Fetch are streams between rankers; a peer (or anything that reaches the port from loopback) can
# send any sequence of chunks. One ranker serves them on loopback from this process, so that after every
# call its DRAM is read back: whatever was sent, the server answers OK, INVALID_ARGUMENT (a message that is
# no request) or RESOURCE_EXHAUSTED (one over the size limit), never crashes, leaves no reservation, staged
# buffer or stray byte behind (the tiers' counters equal the bytes the entries really hold), and indexes
# only entries that arrived whole with their true checksum.

HANDOFF_PUSH = f"/{HANDOFF_SERVICE}/Push"
HANDOFF_FETCH = f"/{HANDOFF_SERVICE}/Fetch"
HANDOFF_EVENTS = 8  # events of an entry a peer could send: 4 KiB of cpu-tiny KV
# Entries a peer could send, used before (older) or after (newer) the ranker's own. The ranker holds two
# entries and a half at most, two of its own: an entry that arrives needs room made (it is staged), or finds
# room an earlier one made, or is refused.
OLDER, NEWER = (0, 1, 2), (3, 4, 5)
RESIDENT_USERS = (900, 901)
OVERSIZED = handoff_pb2.PushRequest(chunk=handoff_pb2.HandoffChunk(data=b"\0" * (MAX_MESSAGE_MB << 20)))


class HandoffTarget:
    """The ranker under fuzz, on its own event loop; the entries it holds of its own, and those a peer
    could send it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.app = self.run(self._start())
        self.sendable = {
            user: made_up(self.app, user, idle_s=200.0 if user in OLDER else 1.0, length=HANDOFF_EVENTS)
            for user in OLDER + NEWER
        }
        self.resident = {
            user: made_up(self.app, user, idle_s=100.0, length=HANDOFF_EVENTS) for user in RESIDENT_USERS
        }
        # The only bytes whose checksum a header can match (whatever the header says they are of).
        self.true_bytes = {self.data(c) for c in (*self.sendable.values(), *self.resident.values())}
        self.restore()
        self.baseline = self.measure()

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    async def _start(self):
        entry_mb = HANDOFF_EVENTS * 512 / 2**20
        config = dataclasses.replace(
            BASE, instance_name="fuzzed", max_message_mb=MAX_MESSAGE_MB, max_long_term_events=64,
            max_connection_age_s=0.0, dram_ttl_s=3600.0, dram_budget_mb=2.5 * entry_mb,
            handoff_staging_mb=1.5 * entry_mb,
        )  # fmt: skip
        app = RankerApp(config)
        await app.grpc.start()  # the handoff service serves without the warm-up
        # The client may send more than the server accepts: the server must refuse it itself.
        options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}", options=options)
        return app

    def key(self, chunks):
        header = chunks[0].entry
        return self.app.cache.key(
            header.user_id, Events(*validation.sequence_arrays(header.events, "e", 64, 64, False))
        )

    @staticmethod
    def data(chunks) -> bytes:
        return b"".join(chunk.data for chunk in chunks)

    def call(self, method: str, request) -> tuple[grpc.StatusCode, str, list[bytes]]:
        """A Push of the messages `request`, or a Fetch of `request`: its status, details and answers."""

        async def answers() -> list[bytes]:
            if method == HANDOFF_PUSH:
                return [await self.channel.stream_unary(method)(iter(request), timeout=30)]
            return [answer async for answer in self.channel.unary_stream(method)(request, timeout=30)]

        async def calling():
            try:
                return grpc.StatusCode.OK, "", await answers()
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or "", []

        return self.run(calling())

    def measure(self) -> tuple[int, int, frozenset]:
        cache = self.app.cache
        return held_bytes(cache)["dram"], cache.dram.used_bytes, frozenset(e.key for e in cache.index)

    def check(self) -> None:
        """Nothing left behind, nothing that did not verify indexed, and the budgets held in real bytes."""
        cache, admission = self.app.cache, self.app.admission
        assert admission.staging.used_bytes == 0 and len(admission.staging) == 0
        assert all(cache.index.get(key) is not None for key, _ in cache.dram.by_last_use())  # no reservation
        assert len(cache.dram) == len(cache.index.entries)
        held, used, _ = self.measure()
        assert held == used <= cache.dram.budget_bytes
        for entry in cache.index:
            assert entry.hbm is None and bytes(kv_wire.as_bytes(entry.dram.buffer)) in self.true_bytes

    def restore(self) -> None:
        """Back to the ranker's own entries only, as they were."""
        cache = self.app.cache
        for entry in list(cache.index):
            cache.moves.remove(entry, "fuzz")
        chunks = [chunk for entry in self.resident.values() for chunk in entry]
        self.run(receive(stream(chunks), self.app.admission))

    def close(self) -> None:
        self.run(self.channel.close())
        self.run(self.app.grpc.server.stop(None))
        self.run(self.app.close())
        self.loop.close()


def handoff_failures() -> dict[tuple[str, str, str], float]:
    """How many handoff calls this process's servers have answered UNKNOWN or INTERNAL, by method, code
    and kind (the registry is the process's: other tests' servers count into it too)."""
    counts = {}
    for method in ("Push", "Fetch"):
        for code in ("UNKNOWN", "INTERNAL"):
            labels = {"grpc_service": HANDOFF_SERVICE, "grpc_method": method, "grpc_code": code}
            for kind in ("client_stream", "server_stream"):
                sample = REGISTRY.get_sample_value("grpc_server_handled_total", {"grpc_type": kind, **labels})
                counts[method, code, kind] = sample or 0.0
    return counts


@pytest.fixture(scope="module")
def handoff() -> Iterator[HandoffTarget]:
    before = handoff_failures()
    target = HandoffTarget()
    yield target
    # Nothing that any test sent made the service answer UNKNOWN or INTERNAL.
    assert handoff_failures() == before
    target.close()


HANDOFF_HEADER_FIELDS = {
    "user_id": TEXT,
    "model_version": TEXT,
    "events": sequences(),
    "layout": st.builds(
        handoff_pb2.KvLayout,
        dtype=st.sampled_from(["float32", "bfloat16", "float16", "int8", ""]),
        layers=SMALL_OR_HOSTILE,
        heads=SMALL_OR_HOSTILE,
        head_dim=st.one_of(st.just(16), INT32),
        tokens_per_event=SMALL_OR_HOSTILE,
    ),
    "nbytes": st.one_of(st.just(HANDOFF_EVENTS * 512), INT64),
    "crc32": st.integers(0, 2**32 - 1),
    "lossy": st.booleans(),
    "idle_s": st.floats(allow_nan=True, allow_infinity=True),
}


@st.composite
def handoff_entries(draw, sendable) -> list[handoff_pb2.HandoffChunk]:
    """One entry's chunks: half the time a true entry, split anywhere; else with some header fields hostile,
    its bytes whole, flipped, cut or lengthened, and its `last` where it belongs, missing, early or twice."""
    chunks = draw(st.sampled_from(list(sendable.values())))
    header = handoff_pb2.HandoffEntry()
    header.CopyFrom(chunks[0].entry)
    data = bytearray(b"".join(chunk.data for chunk in chunks))
    last = "end"
    if draw(st.booleans()):
        for field in draw(st.sets(st.sampled_from(sorted(HANDOFF_HEADER_FIELDS)), max_size=3)):
            value = draw(HANDOFF_HEADER_FIELDS[field])
            if field in ("events", "layout"):
                getattr(header, field).CopyFrom(value)
            else:
                setattr(header, field, value)
        if draw(st.booleans()):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        data = data[: draw(st.sampled_from([len(data), len(data), 0, len(data) // 2, len(data) - 1]))]
        data += draw(st.sampled_from([b"", b"", b"\0", b"extra bytes"]))
        last = draw(st.sampled_from(["end", "end", "missing", "early", "twice"]))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=3)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    out = []
    for i, piece in enumerate(pieces):
        final = i == len(pieces) - 1
        marked = (last in ("end", "twice") and final) or (last == "early" and i == 0)
        out.append(handoff_pb2.HandoffChunk(entry=header if i == 0 else None, data=bytes(piece), last=marked))
    if last == "twice":
        out.append(handoff_pb2.HandoffChunk(data=b"", last=True))
    return out


@st.composite
def handoff_pushes(draw, sendable) -> list[bytes]:
    """A Push's messages: entries as `handoff_entries` makes them and stray chunks (a random header or none,
    random data, `last` or not); at times ended by a message that is no PushRequest or one over the size
    limit (the server reads nothing after either: messages after it would only race its answer)."""
    messages = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.integers(0, 3)):
            chunks = draw(handoff_entries(sendable))
        else:
            fields = {k: draw(optional(v)) for k, v in HANDOFF_HEADER_FIELDS.items()}
            header = handoff_pb2.HandoffEntry(**{k: v for k, v in fields.items() if v is not None})
            data, last = draw(st.binary(max_size=5000)), draw(st.booleans())
            chunks = [handoff_pb2.HandoffChunk(entry=draw(optional(st.just(header))), data=data, last=last)]
        messages += [handoff_pb2.PushRequest(chunk=chunk).SerializeToString() for chunk in chunks]
    ending = draw(st.sampled_from(["none"] * 8 + ["garbage", "oversized"]))
    if ending == "garbage":
        messages.append(draw(st.binary(min_size=1, max_size=200)))
    elif ending == "oversized":
        messages.append(OVERSIZED.SerializeToString())
    return messages


def test_any_push_leaves_nothing_behind_and_indexes_only_verified_entries(handoff: HandoffTarget):
    @FUZZ
    @given(messages=handoff_pushes(handoff.sendable))
    def check(messages: list[bytes]) -> None:
        code, details, _ = handoff.call(HANDOFF_PUSH, messages)
        assert_refused_usefully(code, details)
        handoff.check()
        handoff.restore()
        assert handoff.measure() == handoff.baseline

    check()
    # Still serving: a true entry, used after the ranker's own, is admitted whole (evicting one of them).
    chunks = handoff.sendable[NEWER[0]]
    code, _, (receipt,) = handoff.call(
        HANDOFF_PUSH, [handoff_pb2.PushRequest(chunk=c).SerializeToString() for c in chunks]
    )
    assert code == grpc.StatusCode.OK and handoff_pb2.PushResponse.FromString(receipt).admitted == 1
    handoff.check()
    handoff.restore()


@st.composite
def fetch_requests(draw, target: HandoffTarget) -> bytes:
    """A Fetch of a held entry's user and events, or of a sendable (not held) one's: half the time true,
    else with fields left out or hostile."""
    app = target.app
    chunks = draw(st.sampled_from([*target.resident.values(), *target.sendable.values()]))
    header = chunks[0].entry
    fields = {
        "user_id": header.user_id,
        "model_version": app.runner.model_version,
        "layout": app.admission.layout,
        "long_term": header.events,
    }
    if draw(st.booleans()):
        hostile = {"user_id": TEXT, "model_version": TEXT, "layout": HANDOFF_HEADER_FIELDS["layout"]}
        for field in draw(st.sets(st.sampled_from(sorted(fields)), max_size=3)):
            fields[field] = draw(optional(hostile.get(field, sequences())))
    return handoff_pb2.FetchRequest(**{k: v for k, v in fields.items() if v is not None}).SerializeToString()


def test_any_fetch_sends_only_whole_held_entries_and_changes_nothing(handoff: HandoffTarget):
    @FUZZ
    @given(request=st.one_of(fetch_requests(handoff), st.binary(max_size=2000)))
    def check(request: bytes) -> None:
        code, details, answers = handoff.call(HANDOFF_FETCH, request)
        assert_refused_usefully(code, details)
        chunks = [handoff_pb2.FetchResponse.FromString(answer).chunk for answer in answers]
        if chunks:  # one entry, whole, which the ranker holds, with its true bytes and checksum
            header, data = chunks[0].entry, b"".join(chunk.data for chunk in chunks)
            assert chunks[-1].last and not any(chunk.last for chunk in chunks[:-1])
            assert kv_wire.crc32(memoryview(data)) == header.crc32 and len(data) == header.nbytes
            key = handoff.key(chunks)
            held = handoff.app.cache.index.get(key)
            assert held is not None and bytes(kv_wire.as_bytes(held.dram.buffer)) == data
        assert handoff.measure() == handoff.baseline

    check()
