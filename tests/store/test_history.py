"""`Store.list_at`: a kind as it was at an earlier revision, on every backend (the
read behind a list with resourceVersionMatch=Exact)."""

from __future__ import annotations

import pytest

from hvfleet.model import Hypervisor
from hvfleet.store import Store
from hvfleet.store.errors import RevisionNotReached


def _hv(name: str, rack: str) -> Hypervisor:
    return Hypervisor.model_validate({"metadata": {"name": name, "labels": {"rack": rack}}})


def test_list_at_gives_the_objects_as_they_were(store: Store) -> None:
    store.create(_hv("hv1", "a"), "operator")
    store.create(_hv("hv2", "a"), "operator")
    then = store.list("Hypervisor")
    hv1 = store.get_hypervisor("hv1")
    store.update(hv1.model_copy(update={"metadata": hv1.metadata.model_copy(
        update={"labels": {"rack": "b"}})}), "operator")
    store.delete("Hypervisor", "hv2")
    store.create(_hv("hv3", "a"), "operator")

    past = store.list_at("Hypervisor", then.revision)
    assert past.revision == then.revision
    assert [o.to_dict() for o in past.items] == [o.to_dict() for o in then.items]
    assert [o.metadata.name for o in store.list_at("Hypervisor", then.revision, "rack=a").items] \
        == ["hv1", "hv2"]
    now = store.list_at("Hypervisor", store.revision())
    assert [o.metadata.name for o in now.items] == ["hv1", "hv3"]


def test_list_at_a_revision_not_reached_is_a_typed_refusal(store: Store) -> None:
    """Not a ValueError: every backend (the remote one from its server's 504)
    raises RevisionNotReached, which an edge maps like any other error."""
    store.create(_hv("hv1", "a"), "operator")
    with pytest.raises(RevisionNotReached):
        store.list_at("Hypervisor", store.revision() + 1000)
