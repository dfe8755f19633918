from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model import InvalidInput, parse_selector


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    ("", {}, True),
    ("a=b", {"a": "b"}, True),
    ("a==b", {"a": "b"}, True),
    ("a=b", {"a": "c"}, False),
    ("a!=b", {}, True),
    ("a!=b", {"a": "b"}, False),
    ("a in (x, y)", {"a": "y"}, True),
    ("a in (x,y)", {"a": "z"}, False),
    ("a notin (x)", {}, True),
    ("a notin (x)", {"a": "x"}, False),
    ("a", {"a": ""}, True),
    ("!a", {"a": "1"}, False),
    ("hvfleet.io/az=a, gen in (x), !gpu", {"hvfleet.io/az": "a", "gen": "x"}, True),
])
def test_selector_semantics(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_selector(selector).matches(labels) is expected


# The last four kube-apiserver refuses (400) and hvfleet took: values that are
# no label values ("x y"), a key with two '/' or an upper-case prefix, and a
# trailing ','.
@pytest.mark.parametrize("bad", ["a in (", "a in ()", "=b", "a=b,,c", "a b", "a in x",
                                 "a in (x y)", "a/b/c=1", "Example.com/a=1", "a=1,", "a=" + "x" * 64])
def test_bad_selectors_say_where(bad: str) -> None:
    with pytest.raises(InvalidInput, match="selector"):
        parse_selector(bad)


keys = st.from_regex(r"\A[a-z][a-z0-9]{0,5}\Z")
values = st.from_regex(r"\A[a-z0-9]{1,5}\Z")


@given(st.dictionaries(keys, values, max_size=4), keys, values)
def test_equality_and_inequality_are_complements(labels: dict[str, str], k: str, v: str) -> None:
    eq = parse_selector(f"{k}={v}").matches(labels)
    ne = parse_selector(f"{k}!={v}").matches(labels)
    assert eq != ne
    assert str(parse_selector(f"{k}={v}")) == f"{k}={v}"
