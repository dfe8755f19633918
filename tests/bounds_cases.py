"""Every field of every kind with values just past its bound, or malformed, for
the tests that check such a value is refused (naming the field) and nothing
is written: in the model (tests/model/test_bounds.py) and through the API
(tests/server/test_api_bounds.py). The bounds are hvfleet.model.bounds'."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from hvfleet.model.bounds import (
    INT64_MAX,
    MAX_ANNOTATIONS_BYTES,
    MAX_CELLS,
    MAX_CONDITIONS,
    MAX_EFFECTIVE,
    MAX_LABELS,
    MAX_LEASE_SECONDS,
    MAX_LIST,
    MAX_QUANTITY,
    MAX_RATIO,
    MAX_REASON,
    MAX_RESOURCES,
    MAX_SELECTOR_TERMS,
    MAX_TEXT,
)

Path = tuple[str | int, ...]


def doc(kind: str, name: str) -> dict[str, Any]:
    """A valid document of `kind` with every optional part present, so that each
    path below exists to be spoiled."""
    meta = {"name": name, "labels": {"az": "a"}, "annotations": {"note": "n"}}
    gv = {"apiVersion": "hvfleet.io/v1", "kind": kind}
    if kind == "Hypervisor":
        return {**gv, "metadata": meta,
                "spec": {"overcommit": {"cpu": 2}, "reserved": {"cpu": "1"},
                         "extraCapacity": {"VGPU": "2"}, "maintenanceReason": ""},
                "status": {"capacity": {"cpu": "16", "memory": "64Gi"},
                           "allocation": {"cpu": "1"}, "effectiveCapacity": {"cpu": "32"},
                           "cells": [{"id": 0, "capacity": {"cpu": "8"}}],
                           "instances": [{"uuid": "u-1", "name": "vm-1", "state": "running",
                                          "resources": {"cpu": "1"}}],
                           "conditions": [{"type": "Ready", "status": "True", "reason": "Ok",
                                           "message": "fine"}],
                           "hostCapabilities": {"cpu": {"features": ["vmx"]}, "notes": []},
                           "lastHeartbeatTime": "2026-01-01T00:00:00Z"}}
    if kind == "Reservation":
        return {**gv, "metadata": meta,
                "spec": {"hypervisor": "hv1", "resources": {"cpu": "1"}, "consumer": "vm-1"},
                "status": {"phase": "Active", "message": ""}}
    if kind == "Lease":
        return {**gv, "metadata": {**meta, "name": name},
                "spec": {"holderIdentity": f"agent/{name}", "leaseDurationSeconds": 30,
                         "renewTime": "2026-01-01T00:00:00Z", "acquireTime": "2026-01-01T00:00:00Z",
                         "leaseTransitions": 0}}
    if kind == "OvercommitPolicy":
        return {**gv, "metadata": meta,
                "spec": {"overcommit": {"cpu": 2}, "priority": 0,
                         "selector": {"matchLabels": {"az": "a"}, "matchExpressions": [
                             {"key": "role", "operator": "In", "values": ["compute"]}]}}}
    if kind == "AccessToken":
        return {**gv, "metadata": meta,
                "spec": {"subject": "ops", "role": "operator", "secretSha256": "0" * 64}}
    # The Placement API's records (hvfleet.model.placement).
    if kind == "ResourceProvider":
        return {**gv, "metadata": meta,
                "spec": {"providerName": "rp 1", "rootUuid": "u", "generation": 1,
                         "inventories": {"VCPU": {"total": 8}}, "traits": ["HW_CPU_X86_AVX2"],
                         "aggregates": ["a"], "allocations": {"c": {"VCPU": 1}}}}
    if kind == "PlacementConsumer":
        return {**gv, "metadata": meta,
                "spec": {"projectId": "p", "userId": "u", "generation": 1, "providers": ["u"]}}
    if kind == "PlacementName":
        return {**gv, "metadata": meta, "spec": {"of": "trait", "placementName": "CUSTOM_X"}}
    # The dashboard's history (hvfleet.model.dashboard).
    if kind == "HistorySeries":
        return {**gv, "metadata": meta,
                "spec": {"series": "fleet", "tier": "10s",
                         "points": [{"t": 1767225600, "v": {"cpu": ["1", "0", "32"]}}]}}
    raise AssertionError(kind)


def spoiled(document: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """`document` with `value` at `path` (a key path; a `"*"` key adds a key)."""
    out = copy.deepcopy(document)
    node: Any = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


@dataclass(frozen=True)
class Case:
    kind: str
    path: Path
    values: st.SearchStrategy[Any]
    # The field the error names (pydantic's location, dotted).
    field: str


def _n(min_size: int, char: str = "a") -> st.SearchStrategy[str]:
    return st.integers(min_size, min_size + 64).map(lambda n: char * n)


def _big_int(bound: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(bound + 1, bound * 2 + 10), st.integers(bound + 1, 10**4000),
                     st.integers(-(10**4000), -bound - 1))


def _quantity(bound: int) -> st.SearchStrategy[Any]:
    """Past the magnitude bound (as integers, text, exponents, floats), finer
    than 1n, or not a quantity."""
    return st.one_of(
        _big_int(bound),
        _big_int(bound).map(str),
        st.integers(len(str(bound)), 30).map(lambda e: f"1e{e}"),
        st.just(1e90), st.just(float("inf")), st.just("1e999999999"),
        st.integers(10, 30).map(lambda e: f"1e-{e}"), st.just("0.0000000001"),
        st.sampled_from(["x", "", "1.2.3", "4 Gi", "--1", "1" * 65]),
        st.booleans(),
    )


_TIME = st.sampled_from(["9999-12-31T23:59:59Z", "3000-01-01T00:00:00Z", "1969-12-31T23:59:59Z",
                         "0001-01-01T00:00:00Z", "not a time", "2026-13-01T00:00:00Z"])
_BAD_KEY = st.sampled_from(["bad key", "-x", "x-", "a/" + "b" * 64, "c" * 254 + "/d", "/x", "x/",
                            "UPPER.example.com/x", "a" * 64])
_BAD_VALUE = st.sampled_from(["v" * 64, "bad value", "-v", "v-", "ü"])
_RATIO = st.one_of(st.floats(MAX_RATIO * 1.001, 1e300), st.just(float("inf")), st.just(0),
                   st.floats(-1e9, 0.0009), st.just(10**400), st.sampled_from(["x", None]))
_COUNT = st.one_of(st.integers(INT64_MAX + 1, 10**40), st.integers(-(10**40), -1))


def _many(n: int, item: Any) -> st.SearchStrategy[list[Any]]:
    return st.just([item] * (n + 1))


def _map(n: int) -> st.SearchStrategy[dict[str, str]]:
    return st.just({f"k{i}": "v" for i in range(n + 1)})


CASES: list[Case] = [
    # metadata, the same for every kind (shown on each public kind)
    *[c for kind in ("Hypervisor", "Reservation", "Lease", "OvercommitPolicy") for c in (
        Case(kind, ("metadata", "labels"), _BAD_KEY.map(lambda k: {k: "v"}), "metadata.labels"),
        Case(kind, ("metadata", "labels"), _BAD_VALUE.map(lambda v: {"az": v}), "metadata.labels"),
        Case(kind, ("metadata", "labels"), _map(MAX_LABELS), "metadata.labels"),
        Case(kind, ("metadata", "annotations"), _BAD_KEY.map(lambda k: {k: "v"}),
             "metadata.annotations"),
        Case(kind, ("metadata", "annotations"),
             st.just({"big": "x" * MAX_ANNOTATIONS_BYTES}), "metadata.annotations"),
    )],
    # Hypervisor spec
    Case("Hypervisor", ("spec", "overcommit", "cpu"), _RATIO, "spec.overcommit"),
    Case("Hypervisor", ("spec", "overcommit"), st.just({f"CUSTOM_R{i}": 1 for i in range(MAX_RESOURCES + 1)}),
         "spec.overcommit"),
    Case("Hypervisor", ("spec", "reserved", "cpu"), _quantity(MAX_QUANTITY), "spec.reserved.cpu"),
    Case("Hypervisor", ("spec", "extraCapacity", "VGPU"), _quantity(MAX_QUANTITY),
         "spec.extraCapacity.VGPU"),
    Case("Hypervisor", ("spec", "extraCapacity"),
         st.just({f"CUSTOM_R{i}": "1" for i in range(MAX_RESOURCES + 1)}), "spec.extraCapacity"),
    Case("Hypervisor", ("spec", "maintenanceReason"), _n(MAX_REASON + 1), "spec.maintenanceReason"),
    # Hypervisor status (the agent's)
    Case("Hypervisor", ("status", "capacity", "cpu"), _quantity(MAX_QUANTITY), "status.capacity.cpu"),
    Case("Hypervisor", ("status", "allocation", "cpu"), _quantity(MAX_QUANTITY),
         "status.allocation.cpu"),
    Case("Hypervisor", ("status", "effectiveCapacity", "cpu"), _quantity(MAX_EFFECTIVE),
         "status.effectiveCapacity.cpu"),
    Case("Hypervisor", ("status", "cells", 0, "capacity", "cpu"), _quantity(MAX_QUANTITY),
         "status.cells.0.capacity.cpu"),
    Case("Hypervisor", ("status", "cells", 0, "id"), _COUNT.filter(lambda n: n > 0),
         "status.cells.0.id"),
    Case("Hypervisor", ("status", "cells"), _many(MAX_CELLS, {"id": 0}), "status.cells"),
    Case("Hypervisor", ("status", "instances", 0, "resources", "cpu"), _quantity(MAX_QUANTITY),
         "status.instances.0.resources.cpu"),
    Case("Hypervisor", ("status", "instances", 0, "name"), _n(1025), "status.instances.0.name"),
    Case("Hypervisor", ("status", "instances", 0, "crashCount"), _COUNT,
         "status.instances.0.crashCount"),
    Case("Hypervisor", ("status", "instances", 0, "lastCrashTime"), _TIME,
         "status.instances.0.lastCrashTime"),
    Case("Hypervisor", ("status", "conditions", 0, "message"), _n(MAX_TEXT + 1),
         "status.conditions.0.message"),
    Case("Hypervisor", ("status", "conditions", 0, "reason"), _n(MAX_REASON + 1),
         "status.conditions.0.reason"),
    Case("Hypervisor", ("status", "conditions", 0, "type"), _n(317), "status.conditions.0.type"),
    Case("Hypervisor", ("status", "conditions", 0, "lastTransitionTime"), _TIME,
         "status.conditions.0.lastTransitionTime"),
    Case("Hypervisor", ("status", "conditions", 0, "observedGeneration"), _COUNT,
         "status.conditions.0.observedGeneration"),
    Case("Hypervisor", ("status", "conditions"),
         _many(MAX_CONDITIONS, {"type": "Ready", "status": "True"}), "status.conditions"),
    Case("Hypervisor", ("status", "observedGeneration"), _COUNT, "status.observedGeneration"),
    Case("Hypervisor", ("status", "lastHeartbeatTime"), _TIME, "status.lastHeartbeatTime"),
    Case("Hypervisor", ("status", "hostCapabilities", "cpu", "features"), _many(MAX_LIST, "f"),
         "status.hostCapabilities.cpu.features"),
    Case("Hypervisor", ("status", "hostCapabilities", "notes"), _n(MAX_TEXT + 1).map(lambda s: [s]),
         "status.hostCapabilities.notes.0"),
    Case("Hypervisor", ("status", "hostCapabilities", "maxVcpus"), _COUNT,
         "status.hostCapabilities.maxVcpus"),
    # Reservation
    Case("Reservation", ("spec", "hypervisor"), st.sampled_from(["Bad_Host", "h" * 254, ""]),
         "spec.hypervisor"),
    Case("Reservation", ("spec", "resources", "cpu"), _quantity(MAX_QUANTITY), "spec.resources.cpu"),
    Case("Reservation", ("spec", "consumer"), _n(256), "spec.consumer"),
    Case("Reservation", ("spec", "expiresAt"), _TIME, "spec.expiresAt"),
    # Lease (the agent's)
    Case("Lease", ("spec", "leaseDurationSeconds"),
         st.one_of(st.integers(MAX_LEASE_SECONDS + 1, 10**20), st.just(100_000_000_000_000),
                   st.integers(-(10**6), 0)), "spec.leaseDurationSeconds"),
    Case("Lease", ("spec", "renewTime"), _TIME, "spec.renewTime"),
    Case("Lease", ("spec", "acquireTime"), _TIME, "spec.acquireTime"),
    Case("Lease", ("spec", "leaseTransitions"), _COUNT, "spec.leaseTransitions"),
    # OvercommitPolicy
    Case("OvercommitPolicy", ("spec", "overcommit", "cpu"), _RATIO, "spec.overcommit"),
    Case("OvercommitPolicy", ("spec", "priority"), st.integers(2**31, 10**30), "spec.priority"),
    Case("OvercommitPolicy", ("spec", "selector", "matchLabels"), _BAD_KEY.map(lambda k: {k: "v"}),
         "spec.selector.matchLabels"),
    Case("OvercommitPolicy", ("spec", "selector", "matchLabels"), _BAD_VALUE.map(lambda v: {"az": v}),
         "spec.selector.matchLabels"),
    Case("OvercommitPolicy", ("spec", "selector", "matchExpressions", 0, "key"), _BAD_KEY,
         "spec.selector.matchExpressions.0.key"),
    Case("OvercommitPolicy", ("spec", "selector", "matchExpressions", 0, "values"),
         _BAD_VALUE.map(lambda v: [v]), "spec.selector.matchExpressions.0.values"),
    Case("OvercommitPolicy", ("spec", "selector", "matchExpressions"),
         _many(MAX_SELECTOR_TERMS, {"key": "k", "operator": "Exists"}), "spec.selector.matchExpressions"),
    # AccessToken (stored; written by the token code and admins)
    Case("AccessToken", ("spec", "subject"), _n(129), "spec.subject"),
    Case("AccessToken", ("spec", "expiresAt"), _TIME, "spec.expiresAt"),
    Case("AccessToken", ("metadata", "labels"), _BAD_KEY.map(lambda k: {k: "v"}), "metadata.labels"),
]
