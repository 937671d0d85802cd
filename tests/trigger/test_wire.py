"""The Admit → PreInfer wire reuse that trigger.proto states: AdmitRequest, its Admit-only fields cleared, is
a PreInferRequest byte for byte (the trigger forwards an Admit's own encoding as the PreInfer request).

`mismatches` compares the two messages' descriptors field by field; it is shown to catch a drifted field
number, name or type on descriptors rebuilt with one change, so the test fails the day the protos drift.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor

from relaygr.v1 import common_pb2, ranker_pb2, trigger_pb2
from services.trigger.servicer import ADMIT_ONLY_FIELDS


def mismatches(admit: Descriptor, pre_infer: Descriptor, admit_only: tuple[str, ...]) -> list[str]:
    """Every way in which `admit` with `admit_only` cleared would not encode a `pre_infer` message."""
    found = []
    for field in pre_infer.fields:
        twin = admit.fields_by_number.get(field.number)
        if twin is None:
            found.append(f"PreInferRequest field {field.number} ({field.name}) is not AdmitRequest's")
            continue
        for attribute in ("name", "type", "is_repeated"):
            theirs, ours = getattr(twin, attribute), getattr(field, attribute)
            if theirs != ours:
                found.append(
                    f"field {field.number}: {attribute} {theirs!r} in AdmitRequest, {ours!r} in PreInfer"
                )
        names = [t.message_type.full_name if t.message_type else None for t in (twin, field)]
        if names[0] != names[1]:
            found.append(f"field {field.number}: message {names[0]} against {names[1]}")
    shared = {field.number for field in pre_infer.fields}
    extra = sorted(field.name for field in admit.fields if field.number not in shared)
    if extra != sorted(admit_only):
        found.append(f"AdmitRequest's own fields are {extra}, the trigger clears {sorted(admit_only)}")
    return found


def test_the_shared_fields_match_and_the_trigger_clears_exactly_the_admit_only_ones():
    assert mismatches(trigger_pb2.AdmitRequest.DESCRIPTOR, ranker_pb2.PreInferRequest.DESCRIPTOR,
                      ADMIT_ONLY_FIELDS) == []  # fmt: skip


def test_an_admit_with_its_own_fields_cleared_is_a_pre_infer_request_byte_for_byte():
    history = common_pb2.BehaviorSequence(
        item_ids=[5, 2**40, 7], action_types=[0, 3, 1], timestamps_ms=[1, 2, 3]
    )
    admit = trigger_pb2.AdmitRequest(
        user_id="u-1", long_term=history, num_candidates=128, short_term_length=9
    )
    for field in ADMIT_ONLY_FIELDS:
        admit.ClearField(field)
    expected = ranker_pb2.PreInferRequest(user_id="u-1", long_term=history)
    assert admit.SerializeToString() == expected.SerializeToString()
    assert ranker_pb2.PreInferRequest.FromString(admit.SerializeToString()) == expected


def drifted(change) -> Descriptor:
    """AdmitRequest rebuilt in a fresh pool with `change` applied to its DescriptorProto."""
    pool = descriptor_pool.DescriptorPool()
    common = descriptor_pb2.FileDescriptorProto()
    common_pb2.DESCRIPTOR.CopyToProto(common)
    pool.Add(common)
    trigger = descriptor_pb2.FileDescriptorProto()
    trigger_pb2.DESCRIPTOR.CopyToProto(trigger)
    message = next(m for m in trigger.message_type if m.name == "AdmitRequest")
    change(message)
    pool.Add(trigger)
    return pool.FindMessageTypeByName("relaygr.v1.AdmitRequest")


def field(message, name: str):
    return next(f for f in message.field if f.name == name)


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda m: setattr(field(m, "long_term"), "number", 5), "PreInferRequest field 2 (long_term)"),
        (lambda m: setattr(field(m, "user_id"), "name", "user"), "field 1: name 'user'"),
        (lambda m: setattr(field(m, "user_id"), "type", descriptor_pb2.FieldDescriptorProto.TYPE_BYTES),
         "field 1: type"),
        (lambda m: m.field.add(name="region", number=7, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                               label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL),
         "AdmitRequest's own fields are ['num_candidates', 'region', 'short_term_length']"),
    ],
)  # fmt: skip
def test_a_drifted_admit_request_is_caught(change, complaint):
    found = mismatches(drifted(change), ranker_pb2.PreInferRequest.DESCRIPTOR, ADMIT_ONLY_FIELDS)
    assert any(complaint in line for line in found), found
