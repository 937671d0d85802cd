"""Coalesced PreInfers: what a PreInfer costs a ranker alone and in a PreInferBatch, and what the trigger's
coalescing window does to the Admit and to the Ranks.

At a ranker's capacity rate at the first length (`run`; the floor at the free-pass ranker's):

- **The Ranks alone**: two seconds of pairs' PreInfers are sent first, before the clock, then their Ranks
  alone at the same rate, each on its prefix ready in HBM (a whole point's prefixes, all held at once until
  their Ranks, would not fit in HBM). Their CPU per Rank is what a pair costs besides its
  PreInfer.
- **Pairs, straight to the process**, for single calls (W = 0) and each window W of `--windows-ms`: the
  PreInfers whose intended send times fall within W of a window's first go as one PreInferBatch, sent W
  after it (as the trigger's coalescer sends a window; a window of one is a single PreInfer), each Rank
  `--relay-window-ms` after its own PreInfer's intended time. A PreInfer's own CPU is the pair's less the
  Rank's alone; a coalesced one's against a single one's is what coalescing saves.
- **Pairs through a trigger** (`services.trigger`, routing directly to the ranker, `--admit-all`, its
  `--pre-infer-batch-window-ms` W): each pair's PreInfer is an Admit, its Rank `--relay-window-ms` after
  it. The ranker's CPU per pair, the Admits' P50 and P99 from the client, and the Ranks whose prefix was
  ready in HBM when they arrived (their `prefix_wait_ms` under a millisecond) against those that joined a
  production still running.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import grpc

from bench.micro.serving.config import RANKER_SERVICE, ServingConfig
from bench.micro.serving.generator import born_on
from bench.micro.serving.pairs import (
    RPC_TIMEOUT_S,
    Answers,
    Driver,
    Load,
    Pair,
    Point,
    Shape,
    Via,
    measure_point,
)
from relaygr.v1 import ranker_pb2, trigger_pb2
from services.common.config import listed
from services.launcher.procs import Processes, ServiceProcess

TRIGGER_SERVICE = "relaygr.v1.TriggerService"
# The most PreInfers a window holds: the trigger's default `--pre-infer-batch-max`.
BATCH_MAX = 32
# Seconds of pairs the Ranks alone are measured on (their prefixes pre-inferred first, all held at once).
RANKS_ALONE_S = 2.0


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field's encoding."""
    tag, size, out = (number << 3) | 2, len(payload), bytearray()
    for value in (tag, size):
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out) + payload


def batch_bytes(pre_infers: Sequence[bytes]) -> bytes:
    """A PreInferBatchRequest of already serialized PreInferRequests, without parsing them."""
    return b"".join(_field(1, request) for request in pre_infers)


def admit_bytes(pre_infer: bytes, short_term: int, candidates: int) -> bytes:
    """The Admit of a serialized PreInferRequest: the contract's fields 1 and 2 are the same, and the
    Admit-only ones are appended (protobuf merges concatenated messages)."""
    extra = trigger_pb2.AdmitRequest(num_candidates=candidates, short_term_length=short_term)
    return pre_infer + extra.SerializeToString()


class CoalescedDriver(Driver):
    """The `Via` driver: PreInfers alone or in windows to a ranker, or pairs through a trigger."""

    def __init__(self, address: str, via: Via) -> None:
        super().__init__(address)
        self.via = via
        self._batch = self.channel.unary_unary(
            f"/{RANKER_SERVICE}/PreInferBatch",
            response_deserializer=ranker_pb2.PreInferBatchResponse.FromString,
        )
        self.trigger = grpc.aio.insecure_channel(via.trigger) if via.trigger else None
        if self.trigger is not None:
            self._admit = self.trigger.unary_unary(
                f"/{TRIGGER_SERVICE}/Admit", response_deserializer=trigger_pb2.AdmitResponse.FromString
            )

    async def run(self, pairs: Sequence[Pair], rate: float, delay_s: float) -> Answers:
        answers = Answers()
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05
        via = self.via
        if via.trigger:
            # Every pair of a run has the same sizes: the Admits are built from the first Rank's, up front.
            rank = ranker_pb2.RankRequest.FromString(pairs[0].rank)
            sizes = (len(rank.short_term.item_ids), len(rank.candidate_item_ids))
            admits = [admit_bytes(p.pre_infer, *sizes) for p in pairs]
            sends = [
                self._admitted(admit, p.rank, start + i / rate, delay_s, answers)
                for i, (admit, p) in enumerate(zip(admits, pairs, strict=True))
            ]
        else:
            sends = []
            if not via.ranks_only:
                sends += [self._window(group, start + at, answers) for at, group in windows(pairs, rate, via)]
            if not via.pre_infers_only:
                sends += [self.rank(p.rank, start + i / rate + delay_s, answers) for i, p in enumerate(pairs)]
        await asyncio.gather(*sends)
        answers.wall_s = loop.time() - start
        return answers

    async def sequential(self, pairs: Sequence[Pair], delay_s: float) -> Answers:
        raise ValueError("coalesced PreInfers and trigger pairs are driven at a rate, not one at a time")

    async def _window(self, group: list[Pair], send_at: float, answers: Answers) -> None:
        """A window's PreInfers: one alone, or one PreInferBatch."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, send_at - loop.time()))
        answers.calls += 1
        try:
            if len(group) == 1:
                single = await self._pre_infer(group[0].pre_infer, timeout=RPC_TIMEOUT_S)
                outcomes = [single.outcome]
            else:
                batch = await self._batch(batch_bytes([p.pre_infer for p in group]), timeout=RPC_TIMEOUT_S)
                outcomes = [answer.outcome for answer in batch.answers]
        except grpc.aio.AioRpcError as error:
            answers.count(answers.errors, f"PreInfer {error.code().name}")
            return
        if self.via.pre_infers_only:  # their latency and outcomes are the run's answers
            took_ms = (loop.time() - send_at) * 1000
            for outcome in outcomes:
                answers.latency_ms.append(took_ms)
                answers.count(answers.sources, ranker_pb2.PreInferOutcome.Name(outcome))

    async def _admitted(
        self, admit: bytes, rank: bytes, send_at: float, delay_s: float, answers: Answers
    ) -> None:
        """A pair through the trigger: the Admit (which fires the PreInfer), then the Rank."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, send_at - loop.time()))
        try:
            await self._admit(admit, timeout=RPC_TIMEOUT_S)
            answers.admit_ms.append((loop.time() - send_at) * 1000)
        except grpc.aio.AioRpcError as error:
            answers.count(answers.errors, f"Admit {error.code().name}")
        await self.rank(rank, send_at + delay_s, answers)

    async def close(self) -> None:
        await super().close()
        if self.trigger is not None:
            await self.trigger.close()


def windows(pairs: Sequence[Pair], rate: float, via: Via) -> list[tuple[float, list[Pair]]]:
    """(send time from the start, PreInfers) of each window: the PreInfers within `via.window_s` of the
    window's first, sent that long after it (alone, at once, with no window); a window that fills to
    `BATCH_MAX` is sent when its last one arrives, as the trigger's coalescer sends a full batch."""
    sent: list[tuple[float, list[Pair]]] = []
    first = None
    for i, pair in enumerate(pairs):
        at = i / rate
        if first is None or at >= first + via.window_s or not via.window_s or len(sent[-1][1]) == BATCH_MAX:
            first = at
            sent.append((at + via.window_s, []))
        sent[-1][1].append(pair)
        if len(sent[-1][1]) == BATCH_MAX:
            sent[-1] = (at, sent[-1][1])
    return sent


# ---- the measurement ----


def start_trigger(
    procs: Processes, config: ServingConfig, ranker: ServiceProcess, window_ms: float, cpus
) -> ServiceProcess:
    """A trigger that routes directly to `ranker`, admits every request and coalesces its PreInfers in
    `window_ms` (0: single calls), born on `cpus` (the load's side: it is not the process measured)."""
    args = [
        "--rankers", f"{ranker.name}={ranker.address}", "--admit-all", "true",
        "--pre-infer-batch-window-ms", f"{window_ms:g}",
        "--max-long-term-events", str(max(listed(config, "lengths"))),
        "--max-candidates", str(max(config.candidates, 1024)),
    ]  # fmt: skip
    with born_on(cpus):
        trigger = procs.start("trigger-serving", "services.trigger", TRIGGER_SERVICE, args)
    trigger.wait_healthy(120)
    return trigger


async def coalescing(
    config: ServingConfig,
    load: Load,
    procs: Processes,
    target: ServiceProcess,
    shape: Shape,
    label: str,
    trigger_cpus=None,
    through_trigger: bool = True,
) -> list[dict]:
    """At `shape` (a capacity point): the Ranks alone, on prefixes pre-inferred before the clock; then for
    single calls and each window, pairs straight to `target` with their PreInfers in PreInferBatch windows,
    and (`through_trigger`) pairs through a trigger with that window. A row each (see the module)."""
    # Their prefixes are all held at once, leased, until their Ranks come: RANKS_ALONE_S of them fit in
    # HBM, where a whole point's would not (the rest would be refused, or reloaded from DRAM).
    alone = dataclasses.replace(shape, pairs=max(20, round(shape.rate * RANKS_ALONE_S)))
    ranks = await measure_point(
        load, target, config, alone, f"{label}-ranks", via=Via(ranks_only=True),
        prepare=Via(pre_infers_only=True),
    )  # fmt: skip
    rows = [_row(point=ranks, how="ranks_alone", window_ms=0.0)]
    print(f"{label} Ranks alone: {_line(rows[-1])}", flush=True)
    for window_ms in [0.0, *listed(config, "windows_ms")]:
        direct = Via(window_s=window_ms / 1000)
        point = await measure_point(load, target, config, shape, f"{label}-pi{window_ms:g}", via=direct)
        rows.append(_row(point, "direct", window_ms, ranks))
        print(f"{label} pairs, window {window_ms:g} ms: {_line(rows[-1])}", flush=True)
        if not through_trigger:
            continue
        trigger = start_trigger(procs, config, target, window_ms, trigger_cpus)
        try:
            via = Via(trigger=trigger.address)
            point = await measure_point(load, target, config, shape, f"{label}-tr{window_ms:g}", via=via)
        finally:
            trigger.stop()
        rows.append(_row(point, "through_trigger", window_ms))
        print(f"{label} through a trigger, window {window_ms:g} ms: {_line(rows[-1])}", flush=True)
    return rows


def _row(point: Point, how: str, window_ms: float, ranks: Point | None = None) -> dict:
    """A point's row: with `ranks` (the Ranks alone at the same rate), its PreInfer's own CPU, the pair's
    less the Rank's."""
    pre_infer_ms = None if ranks is None else round(point.non_model_ms - ranks.non_model_ms, 3)
    return {
        "how": how,
        "window_ms": window_ms,
        "per_call": round(point.pairs / point.calls, 2) if point.calls else None,
        "pre_infer_ms": pre_infer_ms,
        **dataclasses.asdict(point),
    }


def _line(row: dict) -> str:
    line = f"{row['rate']:.0f}/s, not the model {row['non_model_ms']:.3f} ms a pair"
    if row["pre_infer_ms"] is not None:
        line += f" (the PreInfer {row['pre_infer_ms']:.3f}, {row['per_call']} a call)"
    if row["admit_p99_ms"] is not None:
        line += f"; Admit P50/P99 {row['admit_p50_ms']:.1f}/{row['admit_p99_ms']:.1f} ms"
    return line + f"; ready {row['ready']}; {row['sources']} {row['errors'] or ''}"
