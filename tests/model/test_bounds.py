"""The bounds of every value a write stores (hvfleet.model.bounds): a value just
past any field's bound, or malformed, is refused naming the field; a value
inside them is one every reader takes (its text reads back, its times add
durations); and readers clamp what an older hvfleet may have stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.bounds_cases import CASES, doc, spoiled

from hvfleet.model import Hypervisor, Quantity
from hvfleet.model.bounds import LATEST, MAX_EFFECTIVE, MAX_LEASE_SECONDS, MAX_QUANTITY
from hvfleet.model.hypervisor import STORED_KINDS, HypervisorStatus
from hvfleet.model.lease import Lease, LeaseSpec, lease_expiry, lease_live
from hvfleet.model.meta import Condition, ObjectMeta
from hvfleet.model.readiness import fresh_until, readiness
from hvfleet.scheduling.index import FleetIndex
from hvfleet.store.base import WatchEvent
from hvfleet.views.tables import hypervisor_row, lease_row


def _fields(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in e["loc"] if p != "[key]") for e in exc.errors()]


@pytest.mark.parametrize("kind", sorted(STORED_KINDS))
def test_the_documents_the_cases_spoil_are_valid(kind: str) -> None:
    STORED_KINDS[kind].model_validate(doc(kind, "x1"))


def test_every_field_a_case_names_exists_in_its_kind() -> None:
    for case in CASES:
        node: Any = doc(case.kind, "x1")
        for part in case.path[:-1]:
            node = node[part]
        assert case.path[-1] in node or isinstance(node, dict), case


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_a_value_past_any_fields_bound_is_refused_naming_the_field(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(CASES), label="case")
    value = data.draw(case.values, label="value")
    bad = spoiled(doc(case.kind, "x1"), case.path, value)
    with pytest.raises(ValidationError) as got:
        STORED_KINDS[case.kind].model_validate(bad)
    assert case.field in _fields(got.value), (case, got.value.errors()[:3])


@given(st.integers(-MAX_QUANTITY, MAX_QUANTITY), st.integers(0, 12),
       st.sampled_from(["", "m", "u", "n", "k", "M", "G", "Ki", "Mi", "Gi", "e3", "e-3"]))
def test_a_quantity_inside_the_bounds_reads_back_as_itself(n: int, places: int, suffix: str) -> None:
    """What a write stores is what every reader takes: the canonical text of any
    accepted quantity is accepted again, as the same value."""
    digits = str(abs(n)).rjust(places + 1, "0")
    text = ("-" if n < 0 else "") + (f"{digits[:-places]}.{digits[-places:]}" if places else digits)
    text += suffix
    status = {"capacity": {"cpu": text}}
    try:
        h = HypervisorStatus.model_validate(status)
    except ValidationError:
        q = Quantity.parse(text)
        assert abs(q.value) > MAX_QUANTITY or (q.value * 10**9).denominator != 1
        return
    stored = h.model_dump(mode="json", by_alias=True)["capacity"]["cpu"]
    assert len(stored) <= 64
    again = HypervisorStatus.model_validate({"capacity": {"cpu": stored}})
    assert again.capacity == h.capacity


def test_the_effective_capacity_bound_holds_what_the_agent_computes() -> None:
    """(capacity + extraCapacity) x the largest ratio fits the effective bound."""
    top = Quantity(2 * MAX_QUANTITY) * 1000
    assert top.value <= MAX_EFFECTIVE
    HypervisorStatus.model_validate({"effectiveCapacity": {"cpu": str(top)}})


def test_a_time_without_a_zone_is_utc() -> None:
    h = Hypervisor.model_validate({"metadata": {"name": "a"},
                                   "status": {"lastHeartbeatTime": "2026-01-01T00:00:00"}})
    assert h.status.last_heartbeat_time == datetime(2026, 1, 1, tzinfo=UTC)


# -- readers clamp what an older hvfleet stored -------------------------------------------------

END = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)


def _lease(duration: int, renewed: datetime) -> Lease:
    # model_construct: as decoded by an hvfleet without the bounds.
    return Lease.model_construct(
        metadata=ObjectMeta(name="hv1"),
        spec=LeaseSpec.model_construct(holder_identity="agent/hv1", lease_duration_seconds=duration,
                                       renew_time=renewed, acquire_time=renewed, lease_transitions=0))


@pytest.mark.parametrize(("duration", "renewed"), [
    (100_000_000_000_000, datetime(2026, 1, 1, tzinfo=UTC)),
    (30, END),
    (100_000_000_000_000, END),
])
def test_a_lease_past_the_bounds_reads_as_live_without_overflow(duration: int, renewed: datetime) -> None:
    lease = _lease(duration, renewed)
    now = datetime.now(UTC)
    assert lease_expiry(lease) is not None
    assert lease_live(lease, now)
    assert lease_row(lease, now, wide=True)[2] == "True"
    index = FleetIndex()
    index.apply(WatchEvent("ADDED", lease, 1))
    index.set_liveness(index._lease_liveness(now))  # what every refresh does


def test_a_heartbeat_at_the_end_of_time_does_not_overflow_readers() -> None:
    h = Hypervisor.model_validate({"metadata": {"name": "hv1"}, "status": {
        "conditions": [Condition(type="Ready", status="True").to_dict()]}})
    old = h.model_copy(update={"status": h.status.model_copy(update={"last_heartbeat_time": END})})
    now = datetime.now(UTC)
    assert fresh_until(old) is not None
    assert readiness(old, now).state == "Ready"
    assert readiness(old, now, staleness=timedelta.max).state == "Ready"
    assert hypervisor_row(old, now, wide=True)[1] == "Ready"
    index = FleetIndex()
    index.apply(WatchEvent("ADDED", old, 1))
    assert index.host("hv1") is not None


def test_the_lease_duration_bound_keeps_expiry_inside_the_timestamp_range() -> None:
    assert LATEST + timedelta(seconds=MAX_LEASE_SECONDS) < datetime.max.replace(tzinfo=UTC)


# -- every field has a bound ------------------------------------------------------------------------

# Bounded by a validator the schema cannot show, or not a caller's to set.
_BOUNDED_ELSEWHERE = {
    "metadata.annotations",  # keys and values together <= 256 KiB (ObjectMeta._annotations)
    "metadata.managedFields[].fieldsV1",  # computed by the store on every write
}


def _unbounded(node: Any, defs: dict[str, Any], path: str) -> list[str]:
    """Paths of the schema whose values have no upper bound."""
    if "$ref" in node:
        return _unbounded(defs[node["$ref"].rsplit("/", 1)[-1]], defs, path)
    if path in _BOUNDED_ELSEWHERE:
        return []
    if "anyOf" in node:
        if node.get("x-kubernetes-int-or-string"):
            return []  # a Quantity: QuantityBound, always
        return [p for option in node["anyOf"] for p in _unbounded(option, defs, path)]
    kind = node.get("type")
    if "enum" in node or "const" in node or kind in ("boolean", "null"):
        return []
    if kind == "string":
        return [] if "maxLength" in node or node.get("format") == "date-time" else [path]
    if kind in ("integer", "number"):
        return [] if "maximum" in node else [path]
    if kind == "array":
        return ([] if "maxItems" in node else [path]) + _unbounded(node["items"], defs, path + "[]")
    if kind == "object":
        found = [p for name, sub in node.get("properties", {}).items()
                 for p in _unbounded(sub, defs, f"{path}.{name}".lstrip("."))]
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            found += [] if "maxProperties" in node else [path]
            found += _unbounded(extra, defs, path + ".*")
        return found
    return [path]


@pytest.mark.parametrize("kind", sorted(STORED_KINDS))
def test_every_field_of_every_kind_has_an_upper_bound(kind: str) -> None:
    schema = STORED_KINDS[kind].model_json_schema(by_alias=True, mode="validation")
    assert _unbounded(schema, schema.get("$defs", {}), "") == []
