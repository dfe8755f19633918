"""Store unreachable (a real etcd, killed and restarted): the agent keeps
running and observing, retries with backoff, and the first write after the
outage carries the newest observation."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import libvirt

from hvfleet.agent.metrics import AgentMetrics
from hvfleet.agent.runner import Agent, AgentConfig
from hvfleet.discovery.libvirt_conn import ensure_event_loop
from hvfleet.store import open_store
from tests.support.etcd_local import EtcdCluster

from .conftest import MI, wait_for

EXTRA = """<domain type='test'>
  <name>during-outage</name>
  <uuid>7d0a0c6e-0000-4000-8000-00000000e7cd</uuid>
  <memory unit='MiB'>256</memory>
  <vcpu>3</vcpu>
  <os><type>hvm</type></os>
</domain>"""


def test_agent_rides_out_a_store_outage_and_writes_the_newest_status(tmp_path: Path) -> None:
    ensure_event_loop()
    # test:///default is shared by every connection of this process, so the
    # agent sees the domain this test defines, with its lifecycle event.
    conn = libvirt.open("test:///default")
    cluster = EtcdCluster(tmp_path / "etcd", size=1).start()
    metrics = AgentMetrics("etcd-host")
    stop = threading.Event()
    try:
        # timeout=1: the etcd store gives up after 1 s instead of its default 15 s
        with open_store(cluster.url("/agent-outage") + "&timeout=1") as store:
            agent = Agent(
                AgentConfig(uri="test:///default", name="etcd-host", backoff_initial=0.1,
                            backoff_cap=0.5),
                store, metrics,
            )
            thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
            thread.start()
            _, h = wait_for(store, "etcd-host", lambda h: bool(h.status.capacity), 20)
            # the test driver's default domain: 2 vCPUs, 8 GiB
            assert h.status.allocation["cpu"] == 2

            cluster.kill_all()
            dom = conn.defineXML(EXTRA)
            time.sleep(2.5)  # the agent observes, fails to write, backs off, retries
            assert thread.is_alive()
            errors = metrics.registry.get_sample_value(
                "hvfleet_agent_store_errors_total", {"hypervisor": "etcd-host"})
            assert errors is not None and errors >= 1

            cluster.start()
            _, h = wait_for(store, "etcd-host", lambda h: h.status.allocation["cpu"] == 5, 15)
            assert h.status.allocation["memory"] == 8 * 1024 * MI + 256 * MI
            assert "during-outage" in {i.name for i in h.status.instances}
            dom.undefine()
            wait_for(store, "etcd-host", lambda h: h.status.allocation["cpu"] == 2, 5)
    finally:
        stop.set()
        cluster.kill_all()
        for d in conn.listAllDomains(0):
            if d.name() == "during-outage":
                d.undefine()
        conn.close()
