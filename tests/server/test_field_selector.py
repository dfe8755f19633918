"""The field selector parser (hvfleet.server.field_selector) against a
plain model of kube-apiserver's reading: terms cut at unescaped commas,
each at its first operator, values unescaped, every term ANDed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model.errors import BadRequest
from hvfleet.server.field_selector import parse_field_selector

NAMES = ["a", "b", "c", "a,b", "x=y", "back\\slash", ""]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


terms = st.tuples(st.sampled_from(["metadata.name", "metadata.namespace"]),
                  st.sampled_from(["=", "==", "!="]), st.sampled_from(NAMES))


@given(st.lists(terms, max_size=5), st.sampled_from(NAMES))
def test_a_name_matches_when_every_term_holds(chosen: list[tuple[str, str, str]], name: str) -> None:
    text = ",".join(f"{field}{op}{_escape(value)}" for field, op, value in chosen)
    want = all(
        ((name if field == "metadata.name" else "") == value) == (op != "!=")
        for field, op, value in chosen)
    assert parse_field_selector(text).matches(name) == want, text


@pytest.mark.parametrize("bad", ["metadata.name", "name=a", "metadata.name=a=b", "metadata.name=a\\q",
                                 "metadata.name=a\\", "metadata.name=a,b", "status.phase=Active"])
def test_what_kube_refuses_is_a_bad_request_naming_the_term(bad: str) -> None:
    with pytest.raises(BadRequest, match="fieldSelector"):
        parse_field_selector(bad)


def test_empty_terms_are_skipped_and_an_empty_selector_matches_everything() -> None:
    assert parse_field_selector(None).everything and parse_field_selector(" , ,").everything
    assert parse_field_selector("metadata.name=a,").matches("a")
