"""What the trigger takes from the fleet's GetProfile answer: the cost model, the KV size, the capacity."""

from __future__ import annotations

import dataclasses

from relaygr.v1 import ranker_pb2
from services.trigger.cost_model import CostModel


@dataclasses.dataclass(frozen=True)
class FleetProfile:
    cost_model: CostModel
    kv_bytes_per_token: int
    # Tokens per second the whole fleet pre-infers when it does nothing else, at its longest profiled prefix.
    pre_infer_capacity_tokens_per_s: float
    model_version: str

    @classmethod
    def from_response(cls, response: ranker_pb2.GetProfileResponse) -> FleetProfile:
        """ValueError when the answer cannot calibrate the trigger (no curve, no KV size)."""
        curve = sorted(response.latency_curve, key=lambda point: point.prefix_length)
        if not curve:
            raise ValueError("the profile has no latency curve")
        if response.kv_bytes_per_token <= 0:
            raise ValueError("the profile has no kv_bytes_per_token")
        longest = curve[-1]
        if longest.pre_infer_ms <= 0:
            raise ValueError(f"the profile's pre_infer_ms at length {longest.prefix_length} is not positive")
        cost_model = CostModel.fit(
            [(point.prefix_length, point.full_ms) for point in curve],
            short_term_length=response.profile_short_term_length,
            num_candidates=response.profile_num_candidates,
        )
        capacity = max(response.fleet_members, 0) * longest.prefix_length / longest.pre_infer_ms * 1000.0
        return cls(
            cost_model=cost_model,
            kv_bytes_per_token=response.kv_bytes_per_token,
            pre_infer_capacity_tokens_per_s=capacity,
            model_version=response.model_version,
        )
