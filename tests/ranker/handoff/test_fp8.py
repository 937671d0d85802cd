"""The cache handoff of FP8 DRAM copies (`--dram-precision fp8`): an entry's scales travel in its header,
under its CRC-32; a receiver of the same precision holds the sender's copy bit for bit, reloads it into the
sender's values and serves the sender's scores, labelled lossy. A receiver of another precision refuses the
entry as another layout, and a scale field of the wrong size or with a value that is no scale as invalid,
naming the field."""

from __future__ import annotations

import logging
import struct

import pytest
import torch

from relaygr.v1 import handoff_pb2
from services.ranker.cache import kv_wire
from services.ranker.cache.acquired import Source
from tests.ranker.handoff.support import cached, deliver, item_action_model, ranked, run, wire
from tests.ranker.harness import cache_app, held_bytes

Refusal = handoff_pb2.HandoffRefusal
SCALES = 2 * 2 * 2  # cpu-tiny: layers x keys or values x heads


def fp8_app(name: str, **overrides):
    return cache_app(instance_name=name, dram_precision="fp8", **overrides)


def with_header(chunks, **changes) -> list[handoff_pb2.HandoffChunk]:
    first = handoff_pb2.HandoffChunk()
    first.CopyFrom(chunks[0])
    for field, value in changes.items():
        setattr(first.entry, field, value)
    return [first, *chunks[1:]]


@pytest.mark.parametrize("layout", ["item", "item_action"])
@run
async def test_an_fp8_entry_arrives_with_its_scales_and_reloads_bit_for_bit(layout, tmp_path) -> None:
    # The preset's layout (one KV row an event) and an imported checkpoint's (two: item, then action).
    model = {} if layout == "item" else {"checkpoint": item_action_model(tmp_path / "model")}
    async with fp8_app("a", **model) as sender, fp8_app("b", **model) as receiver:
        entries = await cached(sender, range(2))
        rows_per_event = 1 if layout == "item" else 2
        assert entries[0].dram.buffer.shape[4] == rows_per_event * entries[0].length
        chunks = await wire(sender, entries)
        header = chunks[0].entry
        assert header.layout.tokens_per_event == rows_per_event
        assert header.layout.dtype == "float8_e4m3fn" and header.lossy
        assert header.scale == kv_wire.scale_bytes(entries[0].dram) and len(header.scale) == SCALES * 4
        tally = await deliver(receiver, chunks)
        assert (tally.admitted, tally.torn, dict(tally.refused)) == (2, 0, {})
        sent = sum(entry.dram.nbytes() for entry in entries)
        assert (
            tally.admitted_bytes
            == held_bytes(receiver.cache)["dram"]
            == receiver.cache.dram.used_bytes
            == sent
        )
        for entry in entries:
            (got,) = receiver.cache.index.of_user(entry.key.user_id)
            assert got.key == entry.key and got.lossy and got.hbm is None
            assert torch.equal(got.dram.buffer.view(torch.uint8), entry.dram.buffer.view(torch.uint8))
            assert torch.equal(got.dram.scale, entry.dram.scale)
            theirs = sender.cache.copier.to_hbm(entry.dram).wait()
            ours = receiver.cache.copier.to_hbm(got.dram).wait()
            assert ours.dtype == torch.float32 and torch.equal(ours.buffer, theirs.buffer)
        for user in range(2):
            from_sender, source = await ranked(sender, user)
            assert source is Source.DRAM
            scores, source = await ranked(receiver, user)
            assert source is Source.PEER and torch.equal(scores, from_sender)


@pytest.mark.parametrize(
    ("sender", "receiver"), [("fp8", "exact"), ("exact", "fp8"), ("bf16", "fp8"), ("fp8", "bf16")]
)
@run
async def test_a_receiver_of_another_precision_refuses_the_entry_as_another_layout(sender, receiver) -> None:
    async with (
        cache_app(instance_name="a", dram_precision=sender) as a,
        cache_app(instance_name="b", dram_precision=receiver) as b,
    ):
        tally = await deliver(b, await wire(a, await cached(a, [4])))
        assert (tally.admitted, dict(tally.refused)) == (0, {Refusal.HANDOFF_REFUSAL_LAYOUT: 1})
        assert not b.cache.index.entries and held_bytes(b.cache) == {"hbm": 0, "dram": 0}


def _scales(header: handoff_pb2.HandoffEntry, index: int, value: float) -> bytes:
    values = list(struct.unpack(f"<{SCALES}f", header.scale))
    values[index] = value
    return struct.pack(f"<{SCALES}f", *values)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h: h.scale[:-4], "entry.scale: 28 bytes, not 32"),
        (lambda h: h.scale + h.scale, "entry.scale: 64 bytes, not 32"),
        (lambda h: b"", "entry.scale: 0 bytes, not 32"),
        (lambda h: _scales(h, 3, float("nan")), "entry.scale: every scale must be finite and positive"),
        (lambda h: _scales(h, 0, float("inf")), "entry.scale: every scale must be finite and positive"),
        (lambda h: _scales(h, 5, -1.0), "entry.scale: every scale must be finite and positive"),
        (lambda h: _scales(h, 7, 0.0), "entry.scale: every scale must be finite and positive"),
    ],
    ids=["short", "long", "missing", "nan", "inf", "negative", "zero"],
)
@run
async def test_a_bad_scale_field_is_refused_as_invalid_naming_the_field(change, message, caplog) -> None:
    async with fp8_app("a") as sender, fp8_app("b") as receiver:
        chunks = await wire(sender, await cached(sender, [5]))
        with caplog.at_level(logging.WARNING):
            tally = await deliver(receiver, with_header(chunks, scale=change(chunks[0].entry)))
        assert (tally.admitted, dict(tally.refused)) == (0, {Refusal.HANDOFF_REFUSAL_INVALID: 1})
        assert message in caplog.text
        assert not receiver.cache.index.entries and held_bytes(receiver.cache) == {"hbm": 0, "dram": 0}
        assert receiver.cache.dram.used_bytes == 0


@run
async def test_a_scale_changed_in_flight_fails_the_checksum_and_scales_on_an_unscaled_entry_are_refused(
    caplog,
) -> None:
    async with fp8_app("a") as sender, fp8_app("b") as receiver:
        chunks = await wire(sender, await cached(sender, [6]))
        header = chunks[0].entry
        doubled = struct.unpack("<f", header.scale[:4])[0] * 2  # still a scale: only the CRC-32 can tell
        tally = await deliver(receiver, with_header(chunks, scale=_scales(header, 0, doubled)))
        assert (tally.admitted, dict(tally.refused)) == (0, {Refusal.HANDOFF_REFUSAL_CHECKSUM: 1})
        assert not receiver.cache.index.entries and receiver.cache.dram.used_bytes == 0
    async with cache_app(instance_name="a") as sender, cache_app(instance_name="b") as receiver:
        chunks = await wire(sender, await cached(sender, [6]))
        assert chunks[0].entry.scale == b""
        with caplog.at_level(logging.WARNING):
            tally = await deliver(receiver, with_header(chunks, scale=b"\0\0\x80\x3f"))
        assert (tally.admitted, dict(tally.refused)) == (0, {Refusal.HANDOFF_REFUSAL_INVALID: 1})
        assert "entry.scale: 4 bytes for a float32 entry, which has no scales" in caplog.text
