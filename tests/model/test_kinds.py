"""One strategy per kind (hvfleet.model.kinds): every stored kind has one, its
names are the ones the CRDs, the API and `kind_of` use, and its hooks say what
the stores and the ownership rules do with that kind."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hvfleet.model.crd import crds
from hvfleet.model.errors import Forbidden, InvalidInput
from hvfleet.model.hypervisor import KINDS, STORED_KINDS, Hypervisor, Reservation
from hvfleet.model.kinds import STRATEGIES, public_kinds, strategy, strategy_of
from hvfleet.model.lease import Lease
from hvfleet.store.base import fleet_kind_of, kind_of

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _reservation(host: str, cpu: int = 1, source: str = "hvfleet") -> Reservation:
    return Reservation.model_validate({
        "metadata": {"name": "r1"},
        "spec": {"hypervisor": host, "consumer": "c", "resources": {"cpu": str(cpu)},
                 "source": source},
    })


def test_every_stored_kind_has_one_strategy_and_the_public_ones_are_the_fleet_kinds() -> None:
    assert list(STRATEGIES) == list(STORED_KINDS)
    assert public_kinds() == list(KINDS)
    for kind, s in STRATEGIES.items():
        assert s.model is STORED_KINDS[kind]


def test_crd_names_are_the_strategies_names() -> None:
    for crd in crds():
        names = crd["spec"]["names"]
        s = strategy(names["kind"])
        assert (names["plural"], names["singular"]) == (s.plural, s.singular)
        assert tuple(names.get("shortNames", ())) == s.short_names


@pytest.mark.parametrize("given", ["hv", "Hypervisors", "hypervisor", " HV "])
def test_kind_of_takes_every_name_of_a_kind_short_ones_too(given: str) -> None:
    assert kind_of(given) == "Hypervisor"


def test_access_tokens_are_stored_but_not_a_fleet_kind() -> None:
    assert kind_of("accesstokens") == "AccessToken"
    with pytest.raises(InvalidInput, match="unknown kind 'accesstokens'"):
        fleet_kind_of("accesstokens")


def test_a_reservation_belongs_to_the_host_it_names_and_is_indexed_there() -> None:
    r = _reservation("h1")
    s = strategy_of(r)
    assert s.host_of(r) == s.indexed_host(r) == "h1"
    assert s.host_in(r.to_dict()) == "h1"
    assert s.host_in({"spec": {"hypervisor": 7}}) is None
    assert s.host_in(["not", "a", "mapping"]) is None


def test_a_lease_belongs_to_its_host_but_is_not_indexed_as_a_claim() -> None:
    lease = Lease.model_validate({"metadata": {"name": "h1"}})
    s = strategy_of(lease)
    assert s.host_of(lease) == "h1"
    assert s.indexed_host(lease) is None
    assert s.status_of(lease) is None
    assert not s.records_fields and s.agent_writes_spec


def test_only_a_hypervisors_own_agent_owns_its_status() -> None:
    h = Hypervisor.model_validate({"metadata": {"name": "h1"}})
    assert strategy_of(h).status_owner(h) == "agent/h1"
    assert strategy_of(_reservation("h1")).status_owner(_reservation("h1")) is None


def test_an_agent_creating_its_hypervisor_writes_no_spec() -> None:
    h = Hypervisor.model_validate({"metadata": {"name": "h1"}, "spec": {"overcommit": {"cpu": 2}}})
    strategy_of(h).validate_create(h, "ops")
    with pytest.raises(Forbidden, match="agents do not write spec"):
        strategy_of(h).validate_create(h, "agent/h1")


def test_a_lease_is_written_only_by_the_agent_it_names() -> None:
    lease = Lease.model_validate({"metadata": {"name": "h1"},
                                  "spec": {"holderIdentity": "agent/h1"}})
    strategy_of(lease).validate_create(lease, "agent/h1")
    with pytest.raises(Forbidden, match="written only by 'agent/h1'"):
        strategy_of(lease).validate_create(lease, "agent/h2")


def test_an_update_may_not_grow_a_reservation_past_its_claim() -> None:
    old, new = _reservation("h1", 1), _reservation("h1", 2)
    s = strategy_of(new)
    s.validate_update(new, old, "ops", NOW)  # shrinking is fine
    with pytest.raises(InvalidInput, match="would hold more than its claim"):
        s.validate_update(old, new, "ops", NOW)


def test_an_update_may_not_change_who_promised_a_reservation() -> None:
    # A mirror of a Placement allocation follows Placement (placement sync may
    # grow it); a claim becoming such a mirror would escape the growth check.
    s = strategy_of(_reservation("h1"))
    for was, becomes in (("hvfleet", "placement"), ("placement", "hvfleet")):
        with pytest.raises(InvalidInput, match=f"{was} → {becomes} would hold more") as err:
            s.validate_update(_reservation("h1", 1, was), _reservation("h1", 1, becomes), "ops", NOW)
        assert err.value.field == "spec.source"
    grown = _reservation("h1", 100, "placement")
    s.validate_update(_reservation("h1", 1, "placement"), grown, "placement-sync", NOW)


def test_only_a_policy_governs_hosts_and_only_those_its_selector_matches() -> None:
    from hvfleet.model.hypervisor import OvercommitPolicy
    from hvfleet.model.kinds import governs

    policy = OvercommitPolicy.model_validate({
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"az": "a"}}, "overcommit": {"cpu": 4}}})
    assert governs(policy, {"az": "a"}) and not governs(policy, {"az": "b"})
    assert not governs(_reservation("h1"), {"az": "a"})
