"""The request parsers added for Kubernetes clients, under arbitrary input:
ListOptions (server/read_options.py) and the protobuf SelfSubject*Review
envelope (server/access_review.py) either answer or refuse with a 4xx Status
naming what is wrong — never another exception."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.model.errors import BadRequest
from hvfleet.server.access_review import decode_protobuf_review
from hvfleet.server.read_options import ReadOptions, read_options
from hvfleet.server.status import ApiError

KEYS = ["resourceVersion", "resourceVersionMatch", "sendInitialEvents", "allowWatchBookmarks",
        "continue"]
VALUES = st.sampled_from(["", "0", "00", "007", "1", "42", "true", "false", "NotOlderThan", "Exact", "x", "٣",
                          "9" * 30]) | st.text(max_size=8)


@settings(max_examples=400, deadline=None)
@given(query=st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5), watch=st.booleans())
def test_read_options_answer_or_refuse_with_a_named_field(query: dict[str, str], watch: bool) -> None:
    try:
        options = read_options(query, watch=watch)
    except BadRequest as exc:
        assert str(exc).split(":")[0] in KEYS
        return
    except ApiError as exc:
        assert exc.code == 422 and exc.causes
        assert all(c["field"] in KEYS for c in exc.causes)
        return
    assert isinstance(options, ReadOptions)
    assert options.revision is None or options.revision >= 1
    if options.send_initial_events is not None:
        assert watch and options.match == "NotOlderThan"


def test_the_watch_list_options_pass() -> None:
    options = read_options({"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
                            "allowWatchBookmarks": "true", "resourceVersion": "7"}, watch=True)
    assert (options.send_initial_events, options.revision) == (True, 7)


def _field(number: int, data: bytes) -> bytes:
    return bytes([number << 3 | 2, len(data)]) + data


def test_a_protobuf_access_review_decodes_as_kubectl_sends_it() -> None:
    attributes = _field(2, b"list") + _field(3, b"hvfleet.io") + _field(5, b"hypervisors")
    review = _field(2, _field(1, attributes))
    type_meta = _field(1, b"authorization.k8s.io/v1") + _field(2, b"SelfSubjectAccessReview")
    body = b"k8s\x00" + _field(1, type_meta) + _field(2, review)
    doc = decode_protobuf_review(body, "SelfSubjectAccessReview")
    assert doc == {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                   "spec": {"resourceAttributes": {"verb": "list", "group": "hvfleet.io",
                                                   "resource": "hypervisors"}}}


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=200), kind=st.sampled_from(["SelfSubjectAccessReview",
                                                            "SelfSubjectRulesReview"]))
def test_any_protobuf_body_decodes_or_is_a_bad_request(body: bytes, kind: str) -> None:
    for data in (body, b"k8s\x00" + body):
        try:
            doc = decode_protobuf_review(data, kind)
        except BadRequest:
            continue
        assert isinstance(doc["spec"], dict)
