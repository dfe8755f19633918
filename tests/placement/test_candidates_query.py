# ruff: noqa: E501  (a table of Placement's messages, one row per line reads best)
"""The query parser of GET /allocation_candidates: each refusal Placement 16.0
answers with 400, at the microversions where it does, with its message (and
the same query accepted where Placement accepts it). Every row is checked
against our parser and against the real Placement in this process."""

from __future__ import annotations

import urllib.parse

import pytest

from hvfleet.placement.candidates import (
    CODE_BAD_VALUE,
    CODE_DUPLICATE_KEY,
    CODE_MISSING_VALUE,
    PlacementBadRequest,
    parse_candidates_query,
)
from tests.placement.inprocess_placement import call, error_message, flat

U1 = "11111111-2222-4333-8444-555555555555"
U2 = "21111111-2222-4333-8444-555555555555"
IQ = "Invalid query string parameters: "
BAD = [
    ((1, 10), [], IQ + "'resources' is a required property"),
    ((1, 10), [("resources", "VCPU:1"), ("limit", "1")], IQ + "Additional properties are not allowed ('limit' was unexpected)"),
    ((1, 16), [("resources", "VCPU:1"), ("limit", "0")], IQ + "'0' does not match '^[1-9][0-9]*$'"),
    ((1, 16), [("resources", "VCPU:1"), ("required", "X")], IQ + "Additional properties are not allowed ('required' was unexpected)"),
    ((1, 25), [("resources", "VCPU:1"), ("group_policy", "all")], IQ + "'all' is not one of ['none', 'isolate']"),
    ((1, 25), [("resources", "VCPU:1"), ("resources_A", "VCPU:1")],
     IQ + "'resources_A' does not match any of the regexes: '^member_of([1-9][0-9]*)?$', "
     "'^required([1-9][0-9]*)?$', '^resources([1-9][0-9]*)?$'"),
    ((1, 30), [("resources", "VCPU:1"), ("in_tree", U1)],
     IQ + "'in_tree' does not match any of the regexes: '^member_of([1-9][0-9]*)?$', "
     "'^required([1-9][0-9]*)?$', '^resources([1-9][0-9]*)?$'"),
    ((1, 34), [("resources", "VCPU:1"), ("root_required", "X")],
     IQ + "'root_required' does not match any of the regexes: '^in_tree([a-zA-Z0-9_-]{1,64})?$', "
     "'^member_of([a-zA-Z0-9_-]{1,64})?$', '^required([a-zA-Z0-9_-]{1,64})?$', "
     "'^resources([a-zA-Z0-9_-]{1,64})?$'"),
    ((1, 10), [("resources", "")],
     "Badly formed resources parameter. Expected resources query string parameter in form: "
     "?resources=VCPU:2,MEMORY_MB:1024. Got: empty string."),
    ((1, 10), [("resources", "VCPU")],
     "Badly formed resources parameter. Expected resources query string parameter in form: "
     "?resources=VCPU:2,MEMORY_MB:1024. Got: VCPU."),
    ((1, 10), [("resources", "VCPU:x")], "Requested resource VCPU expected positive integer amount. Got: x."),
    ((1, 10), [("resources", "VCPU:0")], "Requested resource VCPU requires amount >= 1. Got: 0."),
    ((1, 17), [("resources", "VCPU:1"), ("required", "A,,B")],
     IQ + "Expected 'required' parameter value of the form: HW_CPU_X86_VMX,CUSTOM_MAGIC. Got an empty trait in: A,,B"),
    ((1, 21), [("resources", "VCPU:1"), ("required", "!A")],
     IQ + "Expected 'required' parameter value of the form: HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: !A"),
    ((1, 22), [("resources", "VCPU:1"), ("required", "A,!")],
     IQ + "Expected 'required' parameter value of the form: HW_CPU_X86_VMX,!CUSTOM_MAGIC. Got an empty trait in: A,!"),
    ((1, 22), [("resources", "VCPU:1"), ("required", "A,!A")],
     "Conflicting required and forbidden traits found in the following traits keys: required: (A)"),
    ((1, 38), [("resources", "VCPU:1"), ("required", "in:A,B")],
     IQ + "The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only supported since microversion 1.39. Got: in:A,B"),
    ((1, 39), [("resources", "VCPU:1"), ("required", "in:A,!B")],
     IQ + "The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' does not support forbidden traits. Got: in:A,!B"),
    ((1, 39), [("resources", "VCPU:1"), ("required", "in:A,")],
     IQ + "Expected 'required' parameter value of the form: in:HW_CPU_X86_VMX,CUSTOM_MAGIC. Got an empty trait in: in:A,"),
    ((1, 39), [("resources", "VCPU:1"), ("required", "in:A,B"), ("required", "!A,!B")],
     "Conflicting required and forbidden traits found in the following traits keys: required: (A, B)"),
    ((1, 21), [("resources", "VCPU:1"), ("member_of", "x")],
     IQ + "Expected 'member_of' parameter to contain valid UUID(s). Got: x"),
    ((1, 21), [("resources", "VCPU:1"), ("member_of", f"{U1},{U2}")],
     "Multiple values for 'member_of' must be prefixed with the 'in:' or '!in:' keyword using the "
     f"valid microversion. Got: {U1},{U2}"),
    ((1, 23), [("resources", "VCPU:1"), ("member_of", U1), ("member_of", U2)],
     "Multiple member_of parameters are not supported"),
    ((1, 31), [("resources", "VCPU:1"), ("member_of", "!" + U1)],
     "Forbidden member_of parameters are not supported in the specified microversion"),
    ((1, 31), [("resources", "VCPU:1"), ("in_tree", "x")],
     IQ + "Expected 'in_tree' parameter to be a format of uuid. Got: x"),
    ((1, 25), [("resources1", "VCPU:1"), ("resources2", "VCPU:1")],
     'The "group_policy" parameter is required when specifying more than one "resources{N}" parameter.'),
    ((1, 25), [("resources", "VCPU:1"), ("required1", "A")],
     "All traits parameters must be associated with resources.  Found the following orphaned traits keys: required1"),
    ((1, 25), [("resources", "VCPU:1"), ("member_of1", U1)],
     "All member_of parameters must be associated with resources. Found the following orphaned member_of keys: member_of1"),
    ((1, 35), [("resources", "VCPU:1"), ("in_tree1", U1)], "All request groups must specify resources."),
    ((1, 25), [("group_policy", "none")],
     "At least one request group (`resources` or `resources{$S}`) is required."),
    ((1, 35), [("resources", "VCPU:1"), ("root_required", "A"), ("root_required", "B")],
     "Query parameter 'root_required' may be specified only once."),
    ((1, 35), [("resources", "VCPU:1"), ("root_required", "A,!A")],
     "Conflicting required and forbidden traits found in root_required: A"),
    ((1, 39), [("resources", "VCPU:1"), ("root_required", "in:A")],
     IQ + "The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only supported since microversion 1.39. Got: in:A"),
    ((1, 36), [("resources", "VCPU:1"), ("same_subtree", "1,")],
     "Empty string (unsuffixed group) can not be specified in `same_subtree`"),
    ((1, 36), [("required1", "A")], "There must be at least one resources or resources[$S] parameter."),
    ((1, 36), [("resources", "VCPU:1"), ("required1", "A")],
     "Resourceless suffixed group request should be specified in `same_subtree` query param: bad group(s) - ['1']."),
    ((1, 36), [("resources", "VCPU:1"), ("same_subtree", "_X")],
     "Real suffixes should be specified in `same_subtree`: ['_X'] not found in ['']."),
]
CODES = {
    "Query parameter 'root_required' may": CODE_DUPLICATE_KEY,
    "There must be at least one": CODE_MISSING_VALUE,
    "Resourceless suffixed": CODE_BAD_VALUE,
    "Real suffixes": CODE_BAD_VALUE,
    "Empty string": CODE_BAD_VALUE,
    "Conflicting required and forbidden traits found in root_required": CODE_BAD_VALUE,
}
GOOD = [
    ((1, 10), [("resources", "VCPU:1,MEMORY_MB:512")]),
    ((1, 23), [("resources", "VCPU:1"), ("member_of", f"in:{U1},{U2}")]),
    ((1, 33), [("resources_NET", "VCPU:1"), ("required_NET", "!A")]),
    ((1, 36), [("resources1", "VCPU:1"), ("required2", "A"), ("same_subtree", "1,2"), ("group_policy", "none")]),
    ((1, 39), [("resources", "VCPU:1"), ("required", "in:A,B"), ("required", "!C")]),
]


def _ids(rows: list[tuple[tuple[int, int], list[tuple[str, str]], str]]) -> list[str]:
    return [f"{mv[0]}.{mv[1]}-{urllib.parse.urlencode(q)}" for mv, q, _ in rows]


def _parse(mv: tuple[int, int], query: list[tuple[str, str]]) -> object:
    grouped: dict[str, list[str]] = {}
    for k, v in query:
        grouped.setdefault(k, []).append(v)
    return parse_candidates_query(grouped, mv)


@pytest.mark.parametrize(("mv", "query", "message"), BAD, ids=_ids(BAD))
def test_parser_refuses_where_placement_does_with_its_message(
    mv: tuple[int, int], query: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(PlacementBadRequest) as e:
        _parse(mv, query)
    # Schema errors go on with jsonschema's dump of schema and instance.
    assert e.value.detail.split("\n\nFailed validating")[0].strip() == message
    want = next((c for prefix, c in CODES.items() if message.startswith(prefix)), "placement.undefined_code")
    assert e.value.code == want


@pytest.mark.parametrize(("mv", "query"), GOOD)
def test_parser_accepts_what_placement_accepts(mv: tuple[int, int], query: list[tuple[str, str]]) -> None:
    _parse(mv, query)


def test_parsed_groups_keep_placements_meaning() -> None:
    q = parse_candidates_query(
        {
            "resources": ["VCPU:2,MEMORY_MB:1024"],
            "required": ["in:A,B", "!C,D"],
            "member_of": [f"in:{U1},{U2}", "!" + U2],
            "resources_X": ["SRIOV_NET_VF:1"],
            "in_tree_X": [U1],
            "group_policy": ["isolate"],
            "limit": ["5"],
            "root_required": ["R,!S"],
        },
        (1, 39),
    )
    unsuffixed, x = q.groups
    assert dict(unsuffixed.resources) == {"VCPU": 2, "MEMORY_MB": 1024}
    assert unsuffixed.required_traits == (frozenset({"A", "B"}), frozenset({"D"}))
    assert unsuffixed.forbidden_traits == {"C"}
    assert unsuffixed.member_of == (frozenset({U1, U2}),)
    assert unsuffixed.forbidden_aggregates == {U2}
    assert not unsuffixed.use_same_provider and x.use_same_provider
    assert (x.suffix, x.in_tree) == ("_X", U1)
    assert (q.limit, q.group_policy, q.root_required, q.root_forbidden) == (5, "isolate", {"R"}, {"S"})


@pytest.mark.parametrize(("mv", "query", "message"), BAD, ids=_ids(BAD))
def test_real_placement_gives_the_same_messages(
    mv: tuple[int, int], query: list[tuple[str, str]], message: str
) -> None:
    status, doc = call(
        "GET", "/allocation_candidates?" + urllib.parse.urlencode(query), microversion=f"{mv[0]}.{mv[1]}"
    )
    assert status == 400
    assert error_message(doc).startswith(message)
    with pytest.raises(PlacementBadRequest) as e:
        _parse(mv, query)
    assert flat(e.value.detail) == error_message(doc)
