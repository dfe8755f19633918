"""Each reconcile step alone, on facts built by hand (no libvirt, no store)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hvfleet.agent.reconcile import (
    Facts,
    Observation,
    ParsedDomain,
    Unresolved,
    add_allocation,
    add_capacity,
    add_conditions,
    add_effective_capacity,
    add_instances,
    digest,
    mark_disconnected,
    mark_unreadable_host,
    reconcile,
    same_status,
)
from hvfleet.discovery.domains import DomainRecord, cell_units, parse_domain
from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.hypervisor import OvercommitPolicy
from hvfleet.model.meta import find_condition
from hvfleet.model.spec_sync import spec_sync

from .conftest import GI, UNUSED_NODE_INFO, fixture_text, quantities, two_cell_host

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def domain(xml: str, state: int) -> ParsedDomain:
    d = parse_domain(xml)
    return ParsedDomain(DomainRecord(d.name, d.uuid, xml, state), d, cell_units(d, two_cell_host()))


RUNNING = domain(fixture_text("nova-pinned-hugepages.xml"), 1)
SHUTOFF = domain(fixture_text("vcpu-cpuset-across-cells.xml"), 5)


def facts(count: str = "defined", skipped: tuple[tuple[str, str], ...] = ()) -> Facts:
    return Facts(
        uri="test:///x", topology=two_cell_host(), domains=(RUNNING, SHUTOFF), skipped=skipped,
        count=count,  # type: ignore[arg-type]
        host_capabilities=None, libvirt_version="9.0.0", hypervisor_version="7.2.0", now=T0,
    )


def fresh() -> Hypervisor:
    return Hypervisor(metadata=ObjectMeta(name="h", generation=4))


def test_add_allocation_counts_defined_or_running_per_host_and_cell() -> None:
    h = add_capacity(fresh(), facts())
    defined = add_allocation(h, facts()).status
    # nova guest 4 CPUs + 4Gi of 2 MiB pages on cell 0; straddle 2 CPUs, 1Gi memory split
    assert defined.allocation == quantities(
        {"cpu": "6", "memory": "1Gi", "hugepages-2Mi": "4Gi", "hugepages-1Gi": "0"})
    assert [c.allocation for c in defined.cells] == [
        quantities({"cpu": "5", "memory": "512Mi", "hugepages-2Mi": "4Gi", "hugepages-1Gi": "0"}),
        quantities({"cpu": "1", "memory": "512Mi", "hugepages-2Mi": "0", "hugepages-1Gi": "0"}),
    ]
    running = add_allocation(h, facts("running")).status
    assert running.allocation["cpu"] == 4
    assert running.allocation["memory"] == 0
    assert [c.allocation["cpu"] for c in running.cells] == [4, 0]
    # The status says which domains its allocation counts, so a claim for the
    # shut-off "straddle" holds all it has (model.capacity.counted_in_allocation).
    assert (defined.count_mode, running.count_mode) == ("defined", "running")


def test_add_instances_lists_every_domain_with_state_and_resources() -> None:
    s = add_instances(fresh(), facts("running")).status
    assert [(i.name, i.state) for i in s.instances] == [
        ("instance-0000002a", "running"), ("straddle", "shutoff")]
    assert s.instances[1].resources == quantities({"cpu": "2", "memory": "1Gi"})


def test_add_effective_capacity_uses_spec_through_the_model() -> None:
    h = add_capacity(fresh(), facts())
    h = h.model_copy(update={"spec": h.spec.model_copy(update={"overcommit": {"cpu": 2.5}})})
    s = add_effective_capacity(h, facts()).status
    assert s.effective_capacity["cpu"] == 20  # 8 x 2.5
    assert s.effective_capacity["memory"] == 27 * GI
    assert [c.effective_capacity["cpu"] for c in s.cells] == [10, 10]


def test_conditions_keep_transition_time_until_status_changes() -> None:
    h = add_conditions(fresh(), facts())
    later = add_conditions(h, Facts(**{**facts().__dict__, "now": T0 + timedelta(minutes=5)}))
    ready = find_condition(later.status.conditions, "Ready")
    assert ready is not None and ready.last_transition_time == T0
    broken = add_conditions(later, Facts(**{
        **facts().__dict__, "now": T0 + timedelta(minutes=9),
        "skipped": (("odd", "domain 'odd': no <memory>"),)}))
    ready = find_condition(broken.status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason) == ("False", "UnparsableDomains")
    assert ready.last_transition_time == T0 + timedelta(minutes=9)
    assert "odd" in ready.message and "no <memory>" in ready.message


def test_guests_on_any_page_size_are_counted_and_the_host_stays_ready() -> None:
    """On arm64 a guest on 32 MiB pages counts in `hugepages-32Mi`; one on
    16 MiB pages, a size the host has no pool of, still counts, in its own
    resource: no domain is skipped for its page size, the host is Ready."""
    caps = fixture_text("arm64-hugepages-capabilities.xml")

    def guest(name: str, page_kib: int, gib: int) -> DomainRecord:
        xml = (f"<domain><name>{name}</name><uuid>u-{name}</uuid><memory unit='GiB'>{gib}</memory>"
               f"<vcpu>1</vcpu><memoryBacking><hugepages><page size='{page_kib}' unit='KiB'/>"
               "</hugepages></memoryBacking></domain>")
        return DomainRecord(name, f"u-{name}", xml, 1)

    obs = Observation(uri="qemu:///system", caps_xml=caps, domcaps_xml=None,
                      node_info=UNUSED_NODE_INFO, libvirt_version="9.0.0", hypervisor_version="7.2.0",
                      domains=(guest("on32m", 32768, 1), guest("on16m", 16384, 2), guest("on64k", 64, 1)),
                      at=T0)
    f = digest(obs, "defined")
    assert f.skipped == ()
    s = reconcile(fresh(), f, T0).status
    ready = find_condition(s.conditions, "Ready")
    assert ready is not None and (ready.status, ready.reason) == ("True", "Reconciled")
    assert s.capacity["hugepages-32Mi"] == 512 * 2**20 and s.capacity["hugepages-64Ki"] == 256 * 2**20
    assert "hugepages-16Mi" not in s.capacity
    assert {k: str(v) for k, v in s.allocation.items()} == {
        "cpu": "3", "hugepages-16Mi": "2Gi", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
        "hugepages-32Mi": "1Gi", "hugepages-64Ki": "1Gi", "memory": "0"}
    assert [str(i.resources.get("hugepages-32Mi")) for i in s.instances if i.name == "on32m"] == ["1Gi"]


def test_disconnected_keeps_the_last_observation_and_still_honours_spec() -> None:
    h = reconcile(fresh(), facts(), T0)
    h = h.model_copy(update={"spec": h.spec.model_copy(update={"overcommit": {"cpu": 2.0}})})
    down = mark_disconnected(h, "qemu:///system", "libvirt qemu:///system: gone", T0)
    assert down.status.allocation == h.status.allocation
    assert down.status.instances == h.status.instances
    assert down.status.effective_capacity["cpu"] == 16
    conn = find_condition(down.status.conditions, "LibvirtConnected")
    assert conn is not None and (conn.status, conn.reason) == ("False", "Disconnected")


def test_same_status_ignores_only_the_heartbeat() -> None:
    a = reconcile(fresh(), facts(), T0)
    b = reconcile(a, facts(), T0 + timedelta(seconds=30))
    assert same_status(a, b)
    c = reconcile(a, facts("running"), T0 + timedelta(seconds=30))
    assert not same_status(a, c)


def test_unreadable_host_is_not_ready_and_keeps_the_last_observation() -> None:
    h = reconcile(fresh(), facts(), T0)
    bad = mark_unreadable_host(h, "capabilities: cell 0: no <memory>", T0 + timedelta(seconds=1))
    ready = find_condition(bad.status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason, ready.message) == (
        "False", "UnreadableHost", "capabilities: cell 0: no <memory>")
    assert bad.status.allocation == h.status.allocation


COMPUTE_CPU = OvercommitPolicy.model_validate({
    "metadata": {"name": "compute-cpu"},
    "spec": {"selector": {"matchLabels": {"role": "compute"}}, "overcommit": {"cpu": 3}},
})


def test_unresolved_policies_keep_the_last_effective_capacity_and_say_synced_false() -> None:
    labelled = fresh().model_copy(update={"metadata": ObjectMeta(name="h", generation=4,
                                                                 labels={"role": "compute"})})
    resolved = reconcile(labelled, replace(facts(), policies=(COMPUTE_CPU,)))
    assert resolved.status.effective_capacity["cpu"] == 24  # 8 CPUs x 3 (compute-cpu)
    synced = find_condition(resolved.status.conditions, "Synced")
    assert synced is not None and (synced.status, synced.reason) == ("True", "RatiosResolved")
    assert "cpu 3 (OvercommitPolicy/compute-cpu)" in synced.message

    # The policies cannot be read: nothing is guessed (ratio 1 would say cpu 8).
    why = 'overcommitpolicies.hvfleet.io is forbidden: User "agent/h" cannot list'
    later = reconcile(resolved, replace(facts(), policies=Unresolved(why)), T0 + timedelta(minutes=1))
    assert later.status.effective_capacity == resolved.status.effective_capacity
    assert [c.effective_capacity for c in later.status.cells] == [
        c.effective_capacity for c in resolved.status.cells]
    assert [c.effective_capacity["cpu"] for c in later.status.cells] == [12, 12]
    synced = find_condition(later.status.conditions, "Synced")
    assert synced is not None and (synced.status, synced.reason) == ("False", "RatiosUnresolved")
    assert why in synced.message and synced.last_transition_time == T0 + timedelta(minutes=1)
    # Readers show it: SYNCED False with the agent's reason, before anything else.
    shown = spec_sync(later, [COMPUTE_CPU])
    assert shown.state == "False" and why in shown.message and "RatiosUnresolved" in shown.message

    # A host that never had one gets none, rather than a guess.
    first = reconcile(labelled, replace(facts(), policies=Unresolved(why)))
    assert first.status.effective_capacity == {}
    assert first.status.capacity  # what libvirt showed is still written

    # The same on the fault paths.
    down = mark_disconnected(resolved, "qemu:///system", "gone", T0, Unresolved(why))
    assert down.status.effective_capacity == resolved.status.effective_capacity
    unreadable = mark_unreadable_host(resolved, "bad caps", T0, Unresolved(why))
    synced = find_condition(unreadable.status.conditions, "Synced")
    assert synced is not None and synced.status == "False"
