"""`hvfleet delete` through the real entry point honours finalizers, as a
DELETE over the API does (hvfleet.store.lifecycle): the object is marked and
kept until the last finalizer is removed."""

from __future__ import annotations

from hvfleet.model import Hypervisor
from hvfleet.model.errors import NotFound
from hvfleet.store import lifecycle, open_store

from .conftest import Run


def test_delete_marks_an_object_with_finalizers_and_keeps_it(run: Run, db_url: str) -> None:
    with open_store(db_url) as s:
        s.create(Hypervisor.model_validate({"metadata": {"name": "hv1",
                                                         "finalizers": ["example.com/drain"]}}), "ops")
        s.create(Hypervisor.model_validate({"metadata": {"name": "hv2"}}), "ops")
    r = run("delete", "hypervisor", "hv1")
    assert r.code == 0, r.err
    assert "hypervisor/hv1 marked for deletion, waiting for finalizers: example.com/drain" in r.out
    r = run("delete", "hypervisor", "hv2")
    assert r.code == 0 and "hypervisor/hv2 deleted" in r.out
    with open_store(db_url) as s:
        kept = s.get("Hypervisor", "hv1")
        assert kept.metadata.deletion_timestamp is not None
        done = kept.model_copy(update={"metadata": kept.metadata.model_copy(update={"finalizers": []})})
        lifecycle.update(s, kept, done, lambda o: s.update(o, "ops"))
        for name in ("hv1", "hv2"):
            try:
                s.get("Hypervisor", name)
                raise AssertionError(f"{name} still there")
            except NotFound:
                pass
