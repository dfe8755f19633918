"""Status writes through a real SQLite store: CAS, rebuild on a concurrent spec
change, heartbeat-only writes, ownership."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hvfleet.agent.observe import observe
from hvfleet.agent.reconcile import Facts, digest, reconcile
from hvfleet.agent.status_writer import StatusWriter
from hvfleet.discovery.libvirt_conn import LibvirtConnection
from hvfleet.model import Hypervisor
from hvfleet.model.errors import Forbidden
from hvfleet.store import open_store
from hvfleet.store.base import Store

from .conftest import fleet_uri


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'hv.db'}") as s:
        yield s


@pytest.fixture(scope="module")
def edge_facts() -> Facts:
    conn = LibvirtConnection(fleet_uri("edge-01"))
    conn.open()
    try:
        obs, _ = observe(conn)
    finally:
        conn.close()
    return digest(obs, "defined")


def build(facts: Facts):  # type: ignore[no-untyped-def]
    return lambda h: reconcile(h, facts, datetime.now(UTC))


def set_cpu_ratio(store: Store, ratio: float) -> None:
    store.update_hypervisor(
        "edge-01",
        lambda h: h.model_copy(
            update={"spec": h.spec.model_copy(update={"overcommit": {"cpu": ratio}})}
        ),
        "operator",
    )


def test_missing_hypervisor_is_created_and_status_observes_its_generation(
    store: Store, edge_facts: Facts
) -> None:
    result = StatusWriter(store, "edge-01", 60).write(build(edge_facts))
    h = store.get_hypervisor("edge-01")
    assert result.written
    assert h.metadata.generation == 1
    assert h.status.observed_generation == 1
    assert h.status.allocation["cpu"] == 5
    assert {e.manager for e in h.metadata.managed_fields} == {"agent/edge-01"}


def test_a_spec_change_between_read_and_write_is_rebuilt_not_overwritten(
    store: Store, edge_facts: Facts
) -> None:
    # heartbeat_every=0: always write, so the stale read meets the CAS check
    writer = StatusWriter(store, "edge-01", heartbeat_every=0)
    writer.write(build(edge_facts))
    calls = 0

    def racing_build(h: Hypervisor) -> Hypervisor:
        nonlocal calls
        calls += 1
        if calls == 1:
            # An operator writes spec after we read: our write must go stale.
            set_cpu_ratio(store, 3.0)
        return reconcile(h, edge_facts, datetime.now(UTC))

    result = writer.write(racing_build)
    assert calls == 2
    h = store.get_hypervisor("edge-01")
    assert h.spec.overcommit == {"cpu": 3.0}
    assert h.status.effective_capacity["cpu"] == 24  # 8 x 3, built against the new spec
    assert h.status.observed_generation == h.metadata.generation
    assert result.hypervisor.metadata.resource_version == h.metadata.resource_version


def test_unchanged_status_is_written_only_when_the_heartbeat_is_due(
    store: Store, edge_facts: Facts
) -> None:
    lazy = StatusWriter(store, "edge-01", heartbeat_every=3600)
    first = lazy.write(build(edge_facts)).hypervisor
    again = lazy.write(build(edge_facts))
    assert not again.written
    assert again.hypervisor.metadata.resource_version == first.metadata.resource_version
    # the resync pass writes its heartbeat even when nothing changed
    assert lazy.write(build(edge_facts), heartbeat=True).written

    eager = StatusWriter(store, "edge-01", heartbeat_every=0)
    beat = eager.write(build(edge_facts))
    assert beat.written
    assert beat.hypervisor.status.last_heartbeat_time > first.status.last_heartbeat_time  # type: ignore[operator]
    assert beat.hypervisor.status.conditions == first.status.conditions


def test_an_agent_cannot_write_another_hosts_status(store: Store, edge_facts: Facts) -> None:
    StatusWriter(store, "edge-01", 60).write(build(edge_facts))
    h = store.get_hypervisor("edge-01")
    with pytest.raises(Forbidden):
        store.update(h.model_copy(update={"status": h.status.model_copy(
            update={"allocation": {}})}), "agent/other-host")
