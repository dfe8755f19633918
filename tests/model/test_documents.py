"""The one reader of YAML and JSON documents from outside (hvfleet.model.documents):
aliases and anchors refused at once, nesting bounded, everything else read as
yaml.safe_load and json.loads read it."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.support.documents import alias_bomb, nested

from hvfleet.model.documents import MAX_DEPTH, DocumentError, load_json, load_yaml, load_yaml_all


def test_an_alias_bomb_is_refused_at_its_first_anchor_in_milliseconds() -> None:
    text = alias_bomb()
    assert len(text) < 500
    t0 = time.monotonic()
    with pytest.raises(DocumentError, match=r"line 1, column 5\): found anchor &a0"):
        load_yaml(text)
    assert time.monotonic() - t0 < 0.1


@pytest.mark.parametrize("text, what", [
    ("a: &x 1\nb: *x\n", "anchor &x"),
    ("base: &b {cpu: 1}\nhost:\n  <<: *b\n", "anchor &b"),
    ("- *undefined\n", "alias *undefined"),
])
def test_every_alias_and_anchor_is_refused_naming_it(text: str, what: str) -> None:
    with pytest.raises(DocumentError, match=re.escape(f"found {what}")):
        load_yaml_all(text)


def test_plain_manifests_read_as_safe_load_reads_them() -> None:
    text = ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata:\n  name: hv1\n  labels: {az: a1}\n"
            "spec:\n  overcommit: {cpu: 4.0}\n---\n---\n{\"kind\": \"List\", \"items\": []}\n")
    assert load_yaml_all(text) == [d for d in yaml.safe_load_all(text) if d is not None]


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=MAX_DEPTH + 50), st.sampled_from(["list", "map"]))
@example(MAX_DEPTH, "list").via("the last depth accepted")
@example(MAX_DEPTH + 1, "map").via("the first depth refused")
def test_json_and_yaml_nest_at_most_max_depth(depth: int, kind: str) -> None:
    text = json.dumps(nested(depth, kind))
    if depth <= MAX_DEPTH:
        assert load_json(text) == nested(depth, kind)
        assert load_yaml(text) == nested(depth, kind)
    else:
        with pytest.raises(DocumentError, match=f"more than {MAX_DEPTH} levels"):
            load_json(text)
        with pytest.raises(DocumentError, match=f"more than {MAX_DEPTH} levels"):
            load_yaml(text)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_json_far_past_the_recursion_limit_is_a_document_error(depth: int) -> None:
    with pytest.raises(DocumentError, match="levels deep"):
        load_json("[" * depth + "]" * depth)
    with pytest.raises(DocumentError, match="levels deep"):
        load_yaml("[" * depth + "]" * depth)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@given(json_values)
def test_any_shallow_json_reads_back_unchanged(doc: Any) -> None:
    assert load_json(json.dumps(doc)) == doc
