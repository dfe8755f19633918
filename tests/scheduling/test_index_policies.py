"""OvercommitPolicies in the fleet index and the claim check: a policy created,
changed or deleted in the store changes the rows its selector matches at the
next refresh, and the index agrees with the unvectorised reference
(`fitting_hosts`) and with the claim's own check on random fleets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_fleet import NOW, host, now, put_host

from hvfleet.model import ResourceName
from hvfleet.model.hypervisor import OvercommitPolicy
from hvfleet.scheduling.claims import reserve
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.fit import fitting_hosts, reservations_by_host
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import parse_request
from hvfleet.store import Store, open_store

CPU = ResourceName("cpu")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/hvfleet.db")
    yield s
    s.close()


def policy(
    name: str, ratios: dict[str, float], labels: dict[str, str] | None = None, priority: int = 0
) -> OvercommitPolicy:
    return OvercommitPolicy.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels or {}}, "overcommit": ratios, "priority": priority},
        }
    )


def test_index_follows_policy_changes(store: Store) -> None:
    put_host(store, host("c-1", {"cpu": 8}, allocation={"cpu": 6}, beat=now(), labels={"role": "compute"}))
    put_host(store, host("g-1", {"cpu": 8}, allocation={"cpu": 6}, beat=now(), labels={"role": "gpu"}))
    index = FleetIndex.from_store(store)
    four = parse_request("4", None)
    assert index.fit(four).names == []
    created = store.create(policy("compute", {"cpu": 2}, {"role": "compute"}), "operator")
    assert index.fit(four).names == []  # not refreshed yet
    index.refresh(store)
    assert index.fit(four).names == ["c-1"] and index.free("c-1")[CPU] == 10
    assert [p.name for p in index.policies()] == ["compute"]
    # Widen the selector to every host.
    widened = created.model_copy(
        update={"spec": created.spec.model_copy(update={"selector": policy("x", {"cpu": 1}).spec.selector})}
    )
    store.update(widened, "operator")
    index.refresh(store)
    assert index.fit(four).names == ["c-1", "g-1"]
    store.delete("OvercommitPolicy", "compute")
    index.refresh(store)
    assert index.fit(four).names == [] and index.policies() == []
    # A fresh load reads the policies as well.
    store.create(policy("compute", {"cpu": 2}, {"role": "compute"}), "operator")
    assert FleetIndex.from_store(store).fit(four).names == ["c-1"]


def test_a_claim_checks_against_the_policy_ratio(store: Store) -> None:
    put_host(store, host("c-1", {"cpu": 8}, allocation={"cpu": 6}, beat=now(), labels={"role": "compute"}))
    with pytest.raises(DoesNotFit):
        reserve(store, "c-1", parse_request("4", None), "vm-1")
    store.create(policy("compute", {"cpu": 2}, {"role": "compute"}), "operator")
    reserve(store, "c-1", parse_request("4", None), "vm-1")
    with pytest.raises(DoesNotFit):
        reserve(store, "c-1", parse_request("7", None), "vm-2")  # 16 − 6 − 4 = 6 left


ROLES = ["compute", "gpu", "edge"]


@st.composite
def fleets(draw: Any) -> tuple[list[Any], list[OvercommitPolicy]]:
    hosts = []
    for i in range(draw(st.integers(1, 8))):
        role = draw(st.sampled_from(ROLES))
        own = draw(st.sampled_from([None, 0.5, 1.0, 2.0, 3.0]))
        cap = draw(st.integers(1, 32))
        used = draw(st.integers(0, cap))
        hosts.append(
            host(
                f"h-{i}",
                {"cpu": cap},
                allocation={"cpu": used},
                labels={"role": role},
                overcommit=None if own is None else {"cpu": own},
                beat=NOW,
            )
        )
    policies = [
        policy(
            f"p-{j}",
            {"cpu": draw(st.sampled_from([0.75, 1.5, 2.0, 4.0, 16.0]))},
            None if (r := draw(st.sampled_from([*ROLES, "all"]))) == "all" else {"role": r},
            draw(st.integers(-2, 2)),
        )
        for j in range(draw(st.integers(0, 4)))
    ]
    return hosts, policies


@settings(max_examples=200, deadline=None)
@given(fleets(), st.integers(1, 64))
def test_index_equals_the_reference_with_policies(
    fleet: tuple[list[Any], list[OvercommitPolicy]], cpu: int
) -> None:
    hosts, policies = fleet
    index = FleetIndex()
    index.load(hosts, [], now=NOW, policies=policies)
    request = parse_request(str(cpu), None)
    mine = sorted(index.fit(request, now=NOW).names)
    assert mine == fitting_hosts(hosts, reservations_by_host([]), request, NOW, policies=policies)
