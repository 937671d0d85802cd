"""The break-even where it used to move: a fleet whose rankers warmed up together.

Two cpu-tiny rankers started at once on the test machine's cores with torch's default threads (one per
core each, so each spin-waits for cores the other holds) measure their latency curves several times, up to
100x, too slow. The trigger, behind the router (`--slo-ms 10`, 64 candidates), fits its cost models to such
a curve; with only the fixed 2 ms round trip on the cost side, the slow curve put an 8-event prefix's gain
above it, and the 8-event Admit was admitted in three fleets of five: the fit extrapolated a call's fixed
cost from 128 events and more (and could put it at zero, so the whole pass read as the prefix's work), and
the first points measured stalled most. Every curve now measures a 16-event point, where a pass is almost
all fixed cost, and is monotone in the length, so the gain of a short prefix is measured, not extrapolated;
its points are measured in rounds across the lengths, so a spell of contention cannot make the longest point
the cheapest and the lowered curve flat (no gain at any length: a fleet that admits nothing).
"""

from __future__ import annotations

import grpc
import pytest

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc, trigger_pb2, trigger_pb2_grpc
from services.launcher.fleet import ROUTER, TRIGGER, Fleet, FleetConfig
from services.trigger.fleet_profile import FleetProfile

pytestmark = pytest.mark.slow

OVERHEAD_MS = 2.0  # the trigger's default --relay-overhead-ms


def admit_request(user_id: str, length: int) -> trigger_pb2.AdmitRequest:
    return trigger_pb2.AdmitRequest(
        user_id=user_id,
        long_term=common_pb2.BehaviorSequence(
            item_ids=[(7919 + i * 104729) % 1_000_003 for i in range(length)],
            action_types=[i % 5 for i in range(length)],
        ),
        num_candidates=64,
        short_term_length=8,
    )


def test_an_eight_event_history_gains_nothing_from_rankers_that_warmed_up_together(tmp_path):
    config = FleetConfig(
        rankers=2,
        model_preset="cpu-tiny",
        routing="router",
        base_port=0,
        metrics_base_port=0,
        log_dir=str(tmp_path / "logs"),
        ranker_args="--profile-lengths 128,512,2048",  # torch's default threads: they warm up contended
        trigger_args=f"--slo-ms 10 --relay-overhead-ms {OVERHEAD_MS} --pre-infer-timeout-ms 2000",
    )
    with Fleet(config) as fleet:
        with grpc.insecure_channel(fleet.address(ROUTER)) as channel:
            response = ranker_pb2_grpc.RankerServiceStub(channel).GetProfile(
                ranker_pb2.GetProfileRequest(), timeout=10
            )
        with grpc.insecure_channel(fleet.address(TRIGGER)) as channel:
            trigger = trigger_pb2_grpc.TriggerServiceStub(channel)
            eight = trigger.Admit(admit_request("user-eight", 8), timeout=10)
            long = trigger.Admit(admit_request("user-long", 2048), timeout=10)

    # The mechanism, on the curve the fleet measured: the gain, without the call's fixed cost, is under the
    # round trip.
    profile = FleetProfile.from_response(response)
    gain_ms = profile.pre_infer.compute_ms(8, 0, 0)
    call_ms = profile.pre_infer.fixed_ms
    curve = [(p.prefix_length, round(p.pre_infer_ms, 2)) for p in response.latency_curve]
    print(f"pre-inference curve {curve}: 8 events gain {gain_ms:.3f} ms, their call costs {call_ms:.3f} ms")
    assert response.latency_curve[0].prefix_length == 16  # the anchor point, whatever the profile lengths
    assert gain_ms <= OVERHEAD_MS
    assert (eight.admitted, eight.reason) == (False, trigger_pb2.ADMIT_REASON_NO_GAIN)
    # Not a trigger that refuses everything: a long history is worth relaying on the same curve. (Measured
    # one length at a time, 3 of 8 such fleets measured their longest point faster than every shorter one,
    # and the curve, lowered to the least of any longer point, was flat: no gain at any length. The curve is
    # now measured in rounds across the lengths.)
    assert (long.admitted, long.reason) == (True, trigger_pb2.ADMIT_REASON_ADMITTED)
