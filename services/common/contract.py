"""Facts of the `relaygr.v1` contract that several services and tools name: read from the generated
descriptors, written nowhere else. It knows the protos and no service.

- The full gRPC service names (for health, reflection, generic handlers and raw-bytes calls).
- The metric label of each `CacheSource` (`hbm`, `dram`, `extended`, `miss`, `peer`).
"""

from __future__ import annotations

from relaygr.v1 import common_pb2, handoff_pb2, ranker_pb2, recommend_pb2, trigger_pb2

RANKER_SERVICE = ranker_pb2.DESCRIPTOR.services_by_name["RankerService"].full_name
HANDOFF_SERVICE = handoff_pb2.DESCRIPTOR.services_by_name["CacheHandoffService"].full_name
TRIGGER_SERVICE = trigger_pb2.DESCRIPTOR.services_by_name["TriggerService"].full_name
RECOMMEND_SERVICE = recommend_pb2.DESCRIPTOR.services_by_name["RecommendService"].full_name


def method_path(service: str, method: str) -> str:
    """The HTTP/2 path of an RPC, e.g. `/relaygr.v1.RankerService/PreInfer`."""
    return f"/{service}/{method}"


def cache_source_label(source: int) -> str:
    """The metric label of a CacheSource: hbm, dram, extended, miss, peer (or unspecified)."""
    return common_pb2.CacheSource.Name(source).removeprefix("CACHE_SOURCE_").lower()


# Every cache source a Rank can report, in the enum's order (UNSPECIFIED aside).
CACHE_SOURCES = tuple(cache_source_label(v) for v in common_pb2.CacheSource.values() if v != 0)
