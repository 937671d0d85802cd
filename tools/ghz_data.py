"""`python -m tools.ghz_data`: writes the ghz call data under deploy/loadtest/data/ and the protoset.

The requests come from the synthetic user universe the retrieval stub serves (services/workload/universe.py)
at a fixed epoch and seed, so every file is reproducible from this script; `--check` only compares.

- `recommend.json`: Recommend requests whose users follow a Zipf law over a population, as real traffic
  does: a few users come back often (their prefixes are reused from DRAM), most come once.
- `rank.json`: full Rank requests (long-term and short-term history, candidates) of a sample of users
  with heavy-tailed history lengths; `pre-infer.json`: the PreInfer signals of the same users, so that
  running both configs together exercises the relay.
- `relaygr.protoset`: the FileDescriptorSet of protos/relaygr/v1, from which ghz reads the schema.

ghz sends array entries round-robin and reads call data as protojson, which these files are.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from services.workload.universe import EventArrays, UniverseConfig, UserUniverse

REPO_ROOT = Path(__file__).resolve().parents[1]
LOADTEST_DIR = REPO_ROOT / "deploy" / "loadtest"
DATA_DIR = LOADTEST_DIR / "data"
PROTOSET = LOADTEST_DIR / "relaygr.protoset"
PROTO_ROOT = REPO_ROOT / "protos"

EPOCH_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: histories have their drawn lengths then
# Histories capped at 2048 events keep a data file to a few hundred KB; the law below the cap is the
# stub's default heavy tail.
UNIVERSE = UniverseConfig(universe_seed=0, universe_epoch_ms=EPOCH_MS, history_max=2048)
SEED = 20260101
POPULATION = 5000
ZIPF_EXPONENT = 0.8
RECOMMEND_REQUESTS = 1000
RANK_USERS = 16
TOP_K = 10


def user_id(index: int) -> str:
    return f"user-{index:05d}"


def recommend_requests(rng: np.random.Generator) -> list[dict[str, Any]]:
    weights = np.arange(1, POPULATION + 1, dtype=np.float64) ** -ZIPF_EXPONENT
    # Popularity ranks are shuffled onto ids, so the frequent users are not simply the lowest ids.
    ids = rng.permutation(POPULATION)
    draws = rng.choice(POPULATION, size=RECOMMEND_REQUESTS, p=weights / weights.sum())
    return [{"user_id": user_id(int(ids[d])), "top_k": TOP_K} for d in draws]


def _sequence(events: EventArrays) -> dict[str, list[int]]:
    # int64 fields as JSON numbers, which protojson accepts: what a person writing ghz data would type.
    return {
        "item_ids": events.item_ids.tolist(),
        "action_types": events.action_types.tolist(),
        "timestamps_ms": events.timestamps_ms.tolist(),
    }


def rank_requests(rng: np.random.Generator) -> list[dict[str, Any]]:
    universe = UserUniverse(UNIVERSE, clock=lambda: EPOCH_MS)
    users = rng.choice(POPULATION, size=RANK_USERS, replace=False)
    requests = []
    for number, index in enumerate(users):
        history = universe.history(user_id(int(index)))
        requests.append(
            {
                "user_id": history.user_id,
                "request_id": f"ghz-rank-{number:03d}",
                "long_term": _sequence(history.long_term),
                "short_term": _sequence(history.short_term),
                "candidate_item_ids": universe.candidates(history.user_id).tolist(),
            }
        )
    return requests


def as_json(entries: Sequence[dict[str, Any]]) -> str:
    """A JSON array with one compact entry per line: small, and diffs show which request changed."""
    lines = ",\n".join(json.dumps(entry, separators=(",", ":")) for entry in entries)
    return f"[\n{lines}\n]\n"


def data_files() -> dict[Path, str]:
    rng = np.random.default_rng(SEED)
    recommend = recommend_requests(rng)
    ranks = rank_requests(rng)
    pre_infers = [{"user_id": r["user_id"], "long_term": r["long_term"]} for r in ranks]
    return {
        DATA_DIR / "recommend.json": as_json(recommend),
        DATA_DIR / "rank.json": as_json(ranks),
        DATA_DIR / "pre-infer.json": as_json(pre_infers),
    }


def protoset() -> descriptor_pb2.FileDescriptorSet:
    """The FileDescriptorSet of protos/relaygr/v1, compiled by grpcio-tools' protoc."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "relaygr" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "relaygr.protoset"
        code = protoc.main(
            ["protoc", f"-I{PROTO_ROOT}", "--include_imports", f"--descriptor_set_out={out}", *protos]
        )
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def stale() -> list[Path]:
    """Files that are missing or differ; the protoset is compared as a message, not byte for byte."""
    paths = [path for path, text in data_files().items() if not path.exists() or path.read_text() != text]
    if (
        not PROTOSET.exists()
        or descriptor_pb2.FileDescriptorSet.FromString(PROTOSET.read_bytes()) != protoset()
    ):
        paths.append(PROTOSET)
    return paths


def write() -> None:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in data_files().items():
        path.write_text(text)
    PROTOSET.write_bytes(protoset().SerializeToString(deterministic=True))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.ghz_data", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs; write nothing"
    )
    if parser.parse_args().check:
        paths = stale()
        for path in paths:
            print(f"stale: {path.relative_to(REPO_ROOT)}")
        return 1 if paths else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
