"""OvercommitPolicy precedence (host spec > matching policies by priority, then
name > 1.0), selectors, validation, and the capacity functions taking it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from hvfleet.model import Cell, Hypervisor, Quantity, ResourceName
from hvfleet.model.capacity import (
    free_capacity,
    hypervisor_effective_capacity,
    with_effective_capacity,
)
from hvfleet.model.hypervisor import OvercommitPolicy
from hvfleet.model.overcommit import Ratio, effective_overcommit, matching_policies, resolve_overcommit
from hvfleet.model.spec_sync import spec_sync
from hvfleet.views.tables import hypervisor_columns, hypervisor_row

CPU, MEM, DISK = ResourceName("cpu"), ResourceName("memory"), ResourceName("disk")
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def policy(
    name: str,
    ratios: dict[str, float],
    *,
    priority: int = 0,
    labels: dict[str, str] | None = None,
    expressions: list[dict[str, Any]] | None = None,
) -> OvercommitPolicy:
    selector: dict[str, Any] = {}
    if labels is not None:
        selector["matchLabels"] = labels
    if expressions is not None:
        selector["matchExpressions"] = expressions
    return OvercommitPolicy.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"selector": selector, "overcommit": ratios, "priority": priority},
        }
    )


def hv(labels: dict[str, str], overcommit: dict[str, float] | None = None) -> Hypervisor:
    return Hypervisor.model_validate(
        {
            "metadata": {"name": "h", "labels": labels},
            "spec": {"overcommit": overcommit or {}},
            "status": {
                "capacity": {"cpu": 10, "memory": "10Gi", "disk": "100Gi"},
                "cells": [{"id": 0, "capacity": {"cpu": 4}}, {"id": 1, "capacity": {"cpu": 6}}],
            },
        }
    )


COMPUTE = {"role": "compute", "az": "a"}

# (host labels, host spec.overcommit, policies, expected {resource: (ratio, source)})
CASES: list[
    tuple[str, dict[str, str], dict[str, float], list[OvercommitPolicy], dict[str, tuple[float, str]]]
] = [
    ("no policy, no spec: 1.0 everywhere", COMPUTE, {}, [], {}),
    ("the host's own ratio only", COMPUTE, {"cpu": 2}, [], {"cpu": (2, "spec")}),
    (
        "a matching policy fills what spec does not say",
        COMPUTE,
        {},
        [policy("p", {"cpu": 4}, labels={"role": "compute"})],
        {"cpu": (4, "OvercommitPolicy/p")},
    ),
    (
        "spec beats any policy, per resource",
        COMPUTE,
        {"cpu": 2},
        [policy("p", {"cpu": 4, "memory": 1.5}, priority=100, labels={"role": "compute"})],
        {"cpu": (2, "spec"), "memory": (1.5, "OvercommitPolicy/p")},
    ),
    (
        "a policy that does not match is ignored",
        COMPUTE,
        {},
        [policy("gpu", {"cpu": 8}, labels={"role": "gpu"})],
        {},
    ),
    (
        "higher priority wins",
        COMPUTE,
        {},
        [policy("a-low", {"cpu": 2}, priority=1), policy("z-high", {"cpu": 3}, priority=5)],
        {"cpu": (3, "OvercommitPolicy/z-high")},
    ),
    (
        "equal priority: the name that sorts first wins",
        COMPUTE,
        {},
        [policy("beta", {"cpu": 3}), policy("alpha", {"cpu": 2})],
        {"cpu": (2, "OvercommitPolicy/alpha")},
    ),
    (
        "per resource: a lower policy still gives what a higher one leaves out",
        COMPUTE,
        {},
        [policy("high", {"cpu": 4}, priority=10), policy("low", {"cpu": 1, "memory": 1.2}, priority=0)],
        {"cpu": (4, "OvercommitPolicy/high"), "memory": (1.2, "OvercommitPolicy/low")},
    ),
    (
        "negative priority ranks below the default 0",
        COMPUTE,
        {},
        [policy("fallback", {"cpu": 1.5}, priority=-1), policy("normal", {"cpu": 2.5})],
        {"cpu": (2.5, "OvercommitPolicy/normal")},
    ),
    (
        "an empty selector matches every host",
        {},
        {},
        [policy("fleet", {"disk": 1.1})],
        {"disk": (1.1, "OvercommitPolicy/fleet")},
    ),
    (
        "matchExpressions In / NotIn / Exists / DoesNotExist",
        COMPUTE,
        {},
        [
            policy("in", {"cpu": 2}, expressions=[{"key": "az", "operator": "In", "values": ["a", "b"]}]),
            policy("notin", {"memory": 2}, expressions=[{"key": "az", "operator": "NotIn", "values": ["a"]}]),
            policy("exists", {"disk": 3}, expressions=[{"key": "role", "operator": "Exists"}]),
            policy(
                "absent", {"disk": 9}, priority=9, expressions=[{"key": "role", "operator": "DoesNotExist"}]
            ),
        ],
        {"cpu": (2, "OvercommitPolicy/in"), "disk": (3, "OvercommitPolicy/exists")},
    ),
    (
        "matchLabels and matchExpressions must both hold",
        COMPUTE,
        {},
        [
            policy(
                "both",
                {"cpu": 2},
                labels={"role": "compute"},
                expressions=[{"key": "az", "operator": "In", "values": ["b"]}],
            )
        ],
        {},
    ),
    (
        "a ratio below 1 from a policy",
        COMPUTE,
        {},
        [policy("safe", {"memory": 0.9})],
        {"memory": (0.9, "OvercommitPolicy/safe")},
    ),
]


@pytest.mark.parametrize(
    ("labels", "spec", "policies", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_precedence(
    labels: dict[str, str],
    spec: dict[str, float],
    policies: list[OvercommitPolicy],
    expected: dict[str, tuple[float, str]],
) -> None:
    h = hv(labels, spec)
    got = resolve_overcommit(h, policies)
    assert got == {ResourceName(r): Ratio(v, s) for r, (v, s) in expected.items()}
    assert effective_overcommit(h, policies) == {ResourceName(r): v for r, (v, _) in expected.items()}
    # Order of the policy list never matters.
    assert resolve_overcommit(h, list(reversed(policies))) == got


def test_matching_policies_are_in_precedence_order() -> None:
    ps = [
        policy("b", {"cpu": 1}),
        policy("a", {"cpu": 1}),
        policy("top", {"cpu": 1}, priority=3),
        policy("other", {"cpu": 1}, labels={"role": "gpu"}),
    ]
    assert [p.name for p in matching_policies(hv(COMPUTE), ps)] == ["top", "a", "b"]


def test_capacity_functions_take_the_policy_ratio() -> None:
    h = hv(COMPUTE, {"memory": 2})
    ps = [policy("p", {"cpu": 4, "memory": 8}, labels={"role": "compute"})]
    eff = hypervisor_effective_capacity(h, ps)
    assert eff[CPU] == 40 and eff[MEM] == Quantity.parse("20Gi")  # memory: the host's own 2
    assert hypervisor_effective_capacity(h)[CPU] == 10  # no policies given: spec only
    assert free_capacity(h, [], None, ps)[CPU] == 40
    status = with_effective_capacity(h, ps).status
    assert status.effective_capacity == eff
    assert [c.effective_capacity[CPU] for c in status.cells] == [16, 24]
    assert isinstance(status.cells[0], Cell)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"overcommit": {}}, "a policy must give at least one ratio"),
        ({"overcommit": {"cpu": 0}}, "overcommit.cpu: 0 must be greater than 0"),
        ({"overcommit": {"cpu": "x"}}, "overcommit.cpu: 'x' is not a number"),
        ({"overcommit": {"gpu": 2}}, "gpu"),
        (
            {"overcommit": {"cpu": 2}, "selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "operator In needs at least one value",
        ),
        (
            {
                "overcommit": {"cpu": 2},
                "selector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            },
            "operator Exists takes no values",
        ),
        ({"overcommit": {"cpu": 2}, "selector": {"matchLabels": {"a": "b"}, "oops": 1}}, "oops"),
    ],
)
def test_invalid_policies_are_refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        OvercommitPolicy.model_validate({"metadata": {"name": "p"}, "spec": spec})


def test_spec_sync_says_when_status_is_from_before_a_policy_change() -> None:
    """A policy moves no host's generation, so `SYNCED` also compares the agent's
    status.effectiveCapacity with the capacity under the current policies."""
    h = with_effective_capacity(hv(COMPUTE))  # the agent wrote it with no policy
    h = h.model_copy(
        update={"status": h.status.model_copy(update={"observed_generation": h.metadata.generation})}
    )
    ps = [policy("p", {"cpu": 4}, labels={"role": "compute"})]
    assert spec_sync(h).state == "True"  # the caller read no policies: nothing to compare
    assert spec_sync(h, []).state == "True"
    lagging = spec_sync(h, ps)
    assert lagging.state == "False" and "an OvercommitPolicy changed" in lagging.message
    assert "cpu=10" in lagging.message
    assert spec_sync(with_effective_capacity(h, ps), ps).state == "True"  # the agent caught up
    # No effectiveCapacity written at all: said so, not blamed on a policy (probe 14).
    bare = h.model_copy(update={"status": h.status.model_copy(update={"effective_capacity": {}})})
    unwritten = spec_sync(bare, [])
    assert unwritten.state == "False" and "written no status.effectiveCapacity" in unwritten.message
    assert "OvercommitPolicy" not in unwritten.message
    row = dict(
        zip([c.name for c in hypervisor_columns()], hypervisor_row(h, NOW, None, policies=ps), strict=True)
    )
    assert (row["CPU"], row["SYNCED"]) == ("0/40", "False")
