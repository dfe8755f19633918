"""`hvfleet apply -f` reads YAML through the same bounded reader as the API
(hvfleet.model.documents): an alias bomb or a document nested too deeply is
one line on stderr, exit 2, at once, and nothing is written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hvfleet.model.documents import MAX_DEPTH
from hvfleet.store import open_store
from tests.support.documents import alias_bomb

from .conftest import Run

HEAD = "apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: node-a1}\n"


@pytest.mark.parametrize("doc, message", [
    (HEAD + alias_bomb(), "found anchor &a0"),
    (HEAD + "spec: {extraCapacity: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}\n",
     f"nested more than {MAX_DEPTH} levels deep"),
])
def test_apply_refuses_aliases_and_deep_nesting_at_once(run: Run, tmp_path: Path, db_url: str,
                                                       doc: str, message: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(doc)
    t0 = time.monotonic()
    r = run("apply", "-f", str(path))
    assert time.monotonic() - t0 < 10
    assert r.code == 2, r
    assert message in r.err and "malformed YAML (line" in r.err
    assert r.err.count("\n") == 1
    with open_store(db_url) as s:
        assert s.list_hypervisors() == []


def test_a_kubeconfig_with_anchors_is_refused_by_the_same_reader() -> None:
    from hvfleet.model.errors import InvalidInput
    from hvfleet.store.kubeconfig import load_kubeconfig

    text = ("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters: [{name: x, cluster: &c {server: 'https://127.0.0.1:1'}}]\n"
            "contexts: [{name: c, context: {cluster: x, user: u}}]\nusers: [{name: u, user: *c}]\n")
    with pytest.raises(InvalidInput, match="found anchor &c"):
        load_kubeconfig(text, "kc")
