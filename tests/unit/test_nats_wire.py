"""berth's wire format, without a server: the envelope, the replies each protocol carries byte
for byte, errors crossing as themselves, and what is malformed."""

from __future__ import annotations

import pytest

from berth.errors import Invalid, NoCapacity, NoMatchingPlatform, Unavailable
from berth.model import Spec
from berth.nats.wire import (
    NODE_REPLIES,
    PLACEMENT_REPLIES,
    BadReply,
    MalformedMessage,
    Replies,
    body_of,
    decode_document,
    encode_body,
    encode_model,
    encode_request,
    model_of,
    ok_reply,
)
from berth.ownership import Refused

SOURCE = "berth.node.n1.admit"


def test_a_request_is_the_envelope_around_its_fields() -> None:
    assert encode_request({"workload_id": "w"}) == b'{"v":1,"workload_id":"w"}'
    assert decode_document(encode_request({"a": [1]}), source=SOURCE) == {"v": 1, "a": [1]}
    assert ok_reply({"nodes": 2}) == b'{"v":1,"ok":{"nodes":2}}'


@pytest.mark.parametrize(
    ("data", "field", "text"),
    [
        (b"garbage", None, "not JSON"),
        (b"[1]", None, "not a JSON object"),
        (b'{"v": 2}', "v", "schema version 2, this berth reads 1"),
        (b"{}", "v", "schema version None"),
    ],
)
def test_a_document_that_is_not_a_berth_message_is_malformed(
    data: bytes, field: str | None, text: str
) -> None:
    with pytest.raises(MalformedMessage) as caught:
        decode_document(data, source=SOURCE)
    assert caught.value.field == field and caught.value.source == SOURCE
    assert f"malformed message on {SOURCE}: " in str(caught.value) and text in str(caught.value)


def test_a_stored_or_streamed_document_is_the_envelope_around_it_under_its_name() -> None:
    spec = Spec(vcpus=1, mem=2, disk=3)
    data = encode_model("spec", spec)
    assert data == b'{"v":1,"spec":%s}' % spec.model_dump_json().encode()
    assert data == encode_body("spec", spec.model_dump_json().encode())
    assert Spec.from_dict(body_of(data, "spec", source=SOURCE)) == spec
    # the previous release's bare form is read where the caller allows it, and only there
    bare = spec.model_dump_json().encode()
    assert Spec.from_dict(body_of(bare, "spec", source=SOURCE, bare=True)) == spec
    assert Spec.from_dict(body_of(data, "spec", source=SOURCE, bare=True)) == spec
    with pytest.raises(MalformedMessage) as caught:
        body_of(bare, "spec", source=SOURCE)
    assert caught.value.field == "v"


@pytest.mark.parametrize(
    ("data", "field", "text"),
    [
        (b"garbage", None, "not JSON"),
        (b'"spec"', None, "not a JSON object"),
        (b'{"v": 2, "spec": {}}', "v", "schema version 2, this berth reads 1"),
        (b'{"v": 1, "state": {}}', "spec", "no 'spec' in the envelope"),
        (b"[" * 100_000, None, "nested too deeply"),
    ],
)
def test_a_document_that_is_not_in_the_envelope_is_malformed(
    data: bytes, field: str | None, text: str
) -> None:
    with pytest.raises(MalformedMessage) as caught:
        body_of(data, "spec", source=SOURCE, bare=True)
    assert caught.value.field == field and text in str(caught.value)


def test_a_model_field_names_its_invalid_field_under_its_own() -> None:
    document = {"spec": {"vcpus": 1, "mem": -1, "disk": 1}}
    with pytest.raises(MalformedMessage) as caught:
        model_of(Spec, document, "spec", source=SOURCE)
    assert caught.value.field == "spec.mem"
    with pytest.raises(MalformedMessage) as missing:
        model_of(Spec, {}, "spec", source=SOURCE)
    assert missing.value.field == "spec"
    spec = Spec(vcpus=1, mem=2, disk=3)
    assert model_of(Spec, {"spec": spec.model_dump(mode="json")}, "spec", source=SOURCE) == spec


@pytest.mark.parametrize(
    ("replies", "error", "reply"),
    [
        (
            NODE_REPLIES,
            Refused("mem_exhausted", "1 GiB free", node="n1"),
            b'{"v":1,"error":{"kind":"refused","reason":"mem_exhausted",'
            b'"detail":"1 GiB free","node":"n1"}}',
        ),
        (
            NODE_REPLIES,
            Invalid("must be positive", field="spec.mem"),
            b'{"v":1,"error":{"kind":"invalid","field":"spec.mem","message":"must be positive"}}',
        ),
        (
            NODE_REPLIES,
            Unavailable("the disk is gone"),
            b'{"v":1,"error":{"kind":"failed","message":"Unavailable: the disk is gone"}}',
        ),
        (
            PLACEMENT_REPLIES,
            Unavailable("the disk is gone"),
            b'{"v":1,"error":{"kind":"unavailable","message":"the disk is gone"}}',
        ),
        (
            PLACEMENT_REPLIES,
            NoCapacity("no node fits", {"n1": "mem_exhausted"}),
            b'{"v":1,"error":{"kind":"no_capacity","message":"no node fits",'
            b'"reasons":{"n1":"mem_exhausted"}}}',
        ),
        (
            PLACEMENT_REPLIES,
            NoMatchingPlatform(("linux/arm64",), "linux/amd64"),
            b'{"v":1,"error":{"kind":"no_matching_platform","requested":["linux/arm64"],'
            b'"offered":"linux/amd64"}}',
        ),
        (
            PLACEMENT_REPLIES,
            RuntimeError("boom"),
            b'{"v":1,"error":{"kind":"failed","message":"RuntimeError: boom"}}',
        ),
    ],
)
def test_each_error_has_one_reply_and_reads_back_as_itself(
    replies: Replies, error: Exception, reply: bytes
) -> None:
    assert replies.error(error) == reply
    with pytest.raises(Exception) as caught:
        replies.read(reply, source=SOURCE)
    if b'"kind":"failed"' in reply:
        assert type(caught.value) is Unavailable
        assert str(caught.value) == f"the node failed on {SOURCE}: {type(error).__name__}: {error}"
    else:
        assert type(caught.value) is type(error) and str(caught.value) == str(error)


def test_a_node_does_not_speak_the_placement_kinds() -> None:
    reply = PLACEMENT_REPLIES.error(NoCapacity("no node fits"))
    with pytest.raises(BadReply, match="unknown kind 'no_capacity'"):
        NODE_REPLIES.read(reply, source=SOURCE)


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"<html>", "unreadable reply"),
        (b'{"v":2,"ok":1}', "not a berth reply"),
        (b'{"v":1}', "neither ok nor error"),
        (b'{"v":1,"error":"no"}', "a malformed error reply"),
        (b'{"v":1,"error":{"kind":"refused"}}', "a refusal without a reason"),
        (b'{"v":1,"error":{"kind":["refused"]}}', "unknown kind"),
        (b'{"v":1,"error":{"kind":"no_matching_platform","requested":"x"}}', "malformed error"),
    ],
)
def test_a_reply_that_is_not_a_berth_reply_is_bad(data: bytes, text: str) -> None:
    with pytest.raises(BadReply, match=text):
        PLACEMENT_REPLIES.read(data, source=SOURCE)


def test_an_ok_reply_reads_as_its_value() -> None:
    assert NODE_REPLIES.read(ok_reply([1, "a"]), source=SOURCE) == [1, "a"]
    assert PLACEMENT_REPLIES.read(ok_reply(None), source=SOURCE) is None
