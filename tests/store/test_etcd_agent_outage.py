"""Agents keep working across a 10 s etcd outage and end with the right status.

One real etcd member (127.0.0.1, free ports, data in tmp_path) is killed for
10 s while two agents run against libvirt test-driver hosts:
- `compute-02`, driven by one-shot agent runs in a loop (`--once` as a cron or
  systemd timer would run it), whose node file changes twice during the outage;
- `compute-01`, the long-running agent, whose libvirt sees a domain defined and
  another one undefined during the outage.
After etcd is back both hosts' stored status must show the newest libvirt
state, an operator's spec change made right after the outage must be honoured,
and a watch over the whole run must never show an older status after a newer
one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from pathlib import Path

import pytest
from tests.support.etcd_local import EtcdCluster

from hvfleet.agent.runner import Agent, AgentConfig
from hvfleet.model import HvfleetError, Hypervisor
from hvfleet.model.capacity import hypervisor_effective_capacity
from hvfleet.model.meta import find_condition
from hvfleet.store.base import WatchEvent
from hvfleet.store.etcd import EtcdStore

REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "examples" / "fleet"
OUTAGE_S = 10.0


def _domain_xml(name: str) -> str:
    return (
        "<domain type='test'>"
        f"<name>{name}</name><uuid>{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name)}</uuid>"
        "<memory unit='MiB'>1024</memory><vcpu>1</vcpu><os><type>hvm</type></os>"
        "</domain>"
    )


def _remove_domain(node_xml: str, name: str) -> str:
    pattern = re.compile(
        r"\s*<domain\b(?:(?!</domain>).)*?<name>" + re.escape(name) + r"</name>.*?</domain>", re.S
    )
    out, n = pattern.subn("", node_xml, count=1)
    assert n == 1, f"no domain {name} in node file"
    return out


def _add_domain(node_xml: str, name: str) -> str:
    dom = _domain_xml(name).replace(
        "<domain type='test'>",
        "<domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>",
    )
    return node_xml.replace("</node>", f"  {dom}\n</node>")


def _instances(h: Hypervisor) -> set[str]:
    return {i.name for i in h.status.instances}


class _OnceLoop:
    """`hvfleet agent --once` every 0.3 s, each run a real process of the CLI."""

    def __init__(self, url: str, node: Path) -> None:
        self.url, self.node = url, node
        self.ok = self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        command = [sys.executable, "-m", "hvfleet.cli.main", "agent", "--connect",
                   f"test://{self.node}", "--once", "--store", self.url]
        while not self.stop.is_set():
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode == 0:
                self.ok += 1
            else:
                # An outage is exit 1 with one line naming the store, never a traceback.
                assert done.returncode == 1, done.stderr
                assert "Traceback" not in done.stderr, done.stderr
                self.failed += 1
            self.stop.wait(0.3)


def _watch_all(store: EtcdStore, since: int, stop: threading.Event, out: list[WatchEvent]) -> None:
    while not stop.is_set():
        try:
            for e in store.watch("Hypervisor", since=since, stop=stop, timeout=1.0):
                out.append(e)
                since = e.revision
        except HvfleetError:
            stop.wait(0.2)  # etcd down: watch again from the last revision seen


def _never_goes_back(events: list[WatchEvent], name: str, final: set[str]) -> None:
    """Once the final instance set has been written, no later write shows another."""
    seen = [_instances(e.object) for e in events if e.object.metadata.name == name]
    assert final in seen, f"{name}: final state never written: {seen}"
    first = seen.index(final)
    assert all(s == final for s in seen[first:]), f"{name}: an older status came back: {seen}"


@pytest.mark.timeout(150)
def test_agents_ride_out_a_10s_etcd_outage_and_end_with_the_newest_status(tmp_path: Path) -> None:
    node2 = tmp_path / "compute-02.xml"
    shutil.copy(FLEET / "compute-02.xml", node2)
    with EtcdCluster(tmp_path / "etcd", size=1) as cluster:
        url = cluster.url(prefix="/outage") + "&timeout=3"
        store = EtcdStore.from_url(url)
        since = store.revision()
        events: list[WatchEvent] = []
        stop_watch = threading.Event()
        watcher = threading.Thread(
            target=_watch_all, args=(EtcdStore.from_url(url), since, stop_watch, events)
        )
        watcher.start()

        agent_store = EtcdStore.from_url(url)
        agent = Agent(
            AgentConfig(uri=f"test://{FLEET / 'compute-01.xml'}", resync=2.0, backoff_cap=1.0),
            agent_store,
        )
        stop_agent = threading.Event()
        runner = threading.Thread(target=agent.run, args=(stop_agent,))
        runner.start()
        once = _OnceLoop(url, node2)
        try:
            deadline = time.monotonic() + 30
            while True:
                names = {h.name for h in store.list_hypervisors()}
                if names == {"compute-01", "compute-02"} and once.ok >= 2 and agent.reconciles >= 1:
                    break
                assert time.monotonic() < deadline, f"agents never wrote: {names}"
                time.sleep(0.1)
            before1 = _instances(store.get_hypervisor("compute-01"))
            before2 = _instances(store.get_hypervisor("compute-02"))

            # -- the outage ----------------------------------------------------------
            cluster.kill_all()
            down_at = time.monotonic()
            libvirt = agent.conn._c()  # the agent's own test-driver connection
            libvirt.defineXML(_domain_xml("late-1"))  # state A
            text = node2.read_text()
            node2.write_text(_add_domain(text, "late-2"))
            time.sleep(OUTAGE_S / 3)
            victim1 = sorted(before1)[0]
            dom = libvirt.lookupByName(victim1)
            if dom.isActive():
                dom.destroy()
            dom.undefine()  # state B, the newest
            victim2 = sorted(before2)[0]
            node2.write_text(_remove_domain(node2.read_text(), victim2))
            failed_during = once.failed
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            assert once.failed > 0 and failed_during > 0, "the outage was not felt"
            cluster.start()

            # An operator changes spec right after the outage.
            store.update_hypervisor(
                "compute-01",
                lambda h: h.model_copy(
                    update={"spec": h.spec.model_copy(update={"overcommit": {"cpu": 2.0}})}
                ),
                "operator",
            )
            want1 = (before1 | {"late-1"}) - {victim1}
            want2 = (before2 | {"late-2"}) - {victim2}
            deadline = time.monotonic() + 30
            while True:
                h1, h2 = store.get_hypervisor("compute-01"), store.get_hypervisor("compute-02")
                eff = h1.status.effective_capacity.get("cpu")
                if (
                    _instances(h1) == want1
                    and _instances(h2) == want2
                    and eff == hypervisor_effective_capacity(h1).get("cpu")
                    and h1.status.observed_generation == h1.metadata.generation
                ):
                    break
                assert time.monotonic() < deadline, (
                    f"status not right after the outage: {_instances(h1)} vs {want1}, "
                    f"{_instances(h2)} vs {want2}, effective cpu {eff}"
                )
                time.sleep(0.2)
        finally:
            once.stop.set()
            once.thread.join(30)
            stop_agent.set()
            runner.join(30)
        for h in (h1, h2):
            ready = find_condition(h.status.conditions, "Ready")
            assert ready is not None and ready.status == "True", h.name
        assert h1.spec.overcommit == {"cpu": 2.0}  # the agent never wrote spec back
        time.sleep(1.5)  # let the watcher catch the last writes
        stop_watch.set()
        watcher.join(30)
        _never_goes_back(events, "compute-01", want1)
        _never_goes_back(events, "compute-02", want2)
        assert once.ok > 2
        store.close()
        agent_store.close()
