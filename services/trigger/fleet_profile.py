"""What the trigger takes from the fleet's GetProfile answer: the cost models of a miss and of the prefix's
pre-inference (a cached rank's is not needed: what relay saves is the prefix's computation), the KV size,
and the members of the router's ring (names and virtual nodes), so it can tell which ranker a user's
PreInfer and Rank reach."""

from __future__ import annotations

import dataclasses

from relaygr.v1 import ranker_pb2
from services.affinity.ring import VIRTUAL_NODES
from services.trigger.cost_model import CostModel, Path


@dataclasses.dataclass(frozen=True)
class FleetProfile:
    full: CostModel  # ranking without relay: what a miss costs
    pre_infer: CostModel  # computing the prefix: in the background, and what relay saves a Rank
    kv_bytes_per_token: int
    model_version: str
    members: tuple[str, ...] = ()
    virtual_nodes: int = VIRTUAL_NODES
    hbm_capacity_bytes: int = 0  # the answering ranker's HBM budget: a member's until it reports its own
    provisional: bool = False  # the curve was measured disturbed: its figures are unknown, not slow

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

        def fit(path: Path) -> CostModel:
            points = [(point.prefix_length, getattr(point, path.value)) for point in curve]
            return CostModel.fit(
                points, response.profile_short_term_length, response.profile_num_candidates, path
            )

        return cls(
            full=fit(Path.FULL),
            pre_infer=fit(Path.PRE_INFER),
            kv_bytes_per_token=response.kv_bytes_per_token,
            model_version=response.model_version,
            members=tuple(response.members),
            virtual_nodes=response.ring_virtual_nodes or VIRTUAL_NODES,
            hbm_capacity_bytes=response.hbm_capacity_bytes,
            provisional=response.provisional,
        )
