"""How the ranker reads PreInfer, PreInferBatch and Rank off the wire: the long-term history stays bytes until
it is needed.

A Rank's long-term history is the same bytes its PreInfer carried a few milliseconds earlier: the ranker
decoded, validated and keyed them then. So the ranker parses both requests with a *view* of their message
in which `long_term` is declared `repeated bytes` instead of `BehaviorSequence`: the wire format of the two
is the same (length-delimited), so every request any client sends parses unchanged, and the history
arrives as bytes, with no Python or protobuf object per event. Its SHA-256 (`digest`) finds the events
decoded from those very bytes (`PrefixCache.decoded`), and only a history the ranker has not seen is
decoded (`sequence`), once.

Why repeated: protobuf merges every occurrence of a message field, so a request whose `long_term` comes
in two pieces (two concatenated messages, [1, 2] then [3]) holds [1, 2, 3] through the contract. A
singular bytes field would keep the last piece alone, silently another history. As a repeated field the
view keeps every piece in order, and their concatenation (`history`) is the encoding of the merged
message, which is what the contract reads.

A PreInferBatch's `requests` are PreInferRequests, read through the PreInfer view: each entry's history
stays bytes, its pieces merged within the entry as above (an entry is one occurrence of the repeated field
`requests`, so entries are never merged with each other, through the contract or the view).

The views are built here from the generated descriptors, in a pool of their own, so they can never drift
from the contract: every other field keeps its number, name and type.
"""

from __future__ import annotations

import hashlib

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from relaygr.v1 import common_pb2, ranker_pb2
from services.common.errors import InvalidArgument

_VIEW_PACKAGE = "relaygr.v1.wireview"


def _views(*messages: type) -> dict[str, type]:
    """Message classes equal to `messages` but with their `long_term` field read as repeated bytes (each
    occurrence on the wire, in order), and a field of another of `messages` read as that one's view."""
    common = descriptor_pb2.FileDescriptorProto()
    common_pb2.DESCRIPTOR.CopyToProto(common)
    view = descriptor_pb2.FileDescriptorProto(
        name="relaygr/v1/wireview.proto", package=_VIEW_PACKAGE, syntax="proto3", dependency=[common.name]
    )
    viewed = {f".{m.DESCRIPTOR.full_name}": f".{_VIEW_PACKAGE}.{m.__name__}" for m in messages}
    for message in messages:
        proto = descriptor_pb2.DescriptorProto()
        message.DESCRIPTOR.CopyToProto(proto)
        for field in proto.field:
            if field.name == "long_term":
                field.type, field.label = field.TYPE_BYTES, field.LABEL_REPEATED
                field.ClearField("type_name")
            elif field.type_name in viewed:
                field.type_name = viewed[field.type_name]
        view.message_type.append(proto)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(common)
    pool.Add(view)
    find = pool.FindMessageTypeByName
    named = {m.__name__: f"{_VIEW_PACKAGE}.{m.__name__}" for m in messages}
    return {name: message_factory.GetMessageClass(find(full)) for name, full in named.items()}


_VIEWS = _views(ranker_pb2.PreInferRequest, ranker_pb2.RankRequest, ranker_pb2.PreInferBatchRequest)
PreInferView = _VIEWS["PreInferRequest"]
RankView = _VIEWS["RankRequest"]
PreInferBatchView = _VIEWS["PreInferBatchRequest"]


def history(view) -> bytes:
    """A view's long-term history as one BehaviorSequence's bytes: its pieces joined (bytes.join hands back a
    lone piece, what every client sends, without copying it)."""
    return b"".join(view.long_term)


def digest(raw: bytes) -> bytes:
    """What a history's wire bytes are known by: equal digests, equal bytes, equal events."""
    return hashlib.sha256(raw).digest()


def sequence(raw: bytes, field: str) -> common_pb2.BehaviorSequence:
    """The BehaviorSequence in `raw` (a view's `history`); bytes that are none are refused by `field`."""
    try:
        return common_pb2.BehaviorSequence.FromString(raw)
    except DecodeError as exc:
        raise InvalidArgument(field, f"is not a valid BehaviorSequence ({exc})") from exc
