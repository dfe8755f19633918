"""Guests libvirt takes that the agent mis-counted or could not store, through
the real `hvfleet agent --once` over the libvirt test driver (a node file of
its own per test) and a real SQLite store:

- a name longer than a status holds (libvirt sets no bound): every status
  write failed while the host stayed Ready on its last numbers; now the
  name is cut ('…', the uuid names the guest) and the guest counted;
- a name that is blank, or has blanks at its ends: skipped (the host made
  NotReady) or renamed; now kept exactly as libvirt has it, and counted;
- what cannot be stored at all (guests whose memory sums past any quantity):
  the host is written not Ready (StatusRefused, saying why), and the
  command exits 1, not 2 ("bad input": none was given);
- `--lease-ttl` past a day: refused with exit 2 (the store refused the
  Lease at its first renewal, and the next came a third of it later)."""

from __future__ import annotations

import uuid
from pathlib import Path
from xml.sax.saxutils import escape

from hvfleet.store import open_store

from .conftest import hvfleet

NODE = """<node>
  <cpu><nodes>1</nodes><sockets>1</sockets><cores>8</cores><threads>2</threads>
  <mhz>2600</mhz><model>x86_64</model></cpu>
  <memory>16777216</memory>
{domains}
</node>"""
DOMAIN = """  <domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>
    <name>{name}</name><uuid>{uuid}</uuid>
    <memory unit='KiB'>{kib}</memory><vcpu>{vcpus}</vcpu><os><type>hvm</type></os>{state}
  </domain>"""


def _node(tmp_path: Path, guests: list[tuple[str, int, int]], states: dict[str, int] | None = None) -> str:
    states = states or {}
    domains = "\n".join(DOMAIN.format(
        name=escape(name), uuid=uuid.uuid4(), kib=kib, vcpus=vcpus,
        state=f"<test:runstate>{states[name]}</test:runstate>" if name in states else "")
        for name, vcpus, kib in guests)
    path = tmp_path / "node.xml"
    path.write_text(NODE.format(domains=domains))
    return f"test://{path}"


def test_odd_names_libvirt_takes_are_counted_and_kept(tmp_path: Path) -> None:
    long = "g" * 1100
    uri = _node(tmp_path, [(long, 4, 1 << 20), (" ", 2, 1 << 20), (" lead", 1, 1 << 20)])
    url = f"sqlite:///{tmp_path}/h.db"
    done = hvfleet("agent", "--connect", uri, "--name", "odd", "--once", "--store", url)
    assert done.returncode == 0, done.stderr
    with open_store(url) as s:
        h = s.get_hypervisor("odd")
    assert str(h.status.allocation["cpu"]) == "7"
    names = sorted(i.name for i in h.status.instances)
    assert names == [" ", " lead", "g" * 1023 + "…"]
    ready = next(c for c in h.status.conditions if c.type == "Ready")
    assert ready.status == "True", ready


def test_a_status_that_cannot_be_stored_leaves_the_host_not_ready_and_exits_1(tmp_path: Path) -> None:
    most = 2**53 - 1  # KiB: the largest <memory> libvirt takes
    uri = _node(tmp_path, [(f"big{i}", 1, most) for i in range(130)])
    url = f"sqlite:///{tmp_path}/h.db"
    done = hvfleet("agent", "--connect", uri, "--name", "huge", "--once", "--store", url)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "status cannot be stored" in done.stderr and "Traceback" not in done.stderr
    with open_store(url) as s:
        h = s.get_hypervisor("huge")
    ready = next(c for c in h.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "StatusRefused"), ready
    assert "allocation" in ready.message


def test_under_count_running_a_crashed_guest_libvirt_keeps_is_counted(tmp_path: Path) -> None:
    """libvirt keeps a domain in the crashed state only while its QEMU process
    is kept (on_crash=preserve), holding its memory, and calls it active; the
    agent left it out of the allocation with the shut-off ones."""
    import libvirt

    uri = _node(tmp_path, [("up", 2, 1 << 20), ("crashed", 6, 1 << 20), ("off", 4, 1 << 20)],
                states={"crashed": 6, "off": 5})
    conn = libvirt.open(uri)
    try:
        assert conn.lookupByName("crashed").isActive() == 1
        assert conn.lookupByName("off").isActive() == 0
    finally:
        conn.close()
    url = f"sqlite:///{tmp_path}/h.db"
    done = hvfleet("agent", "--connect", uri, "--name", "c", "--count", "running", "--once", "--store", url)
    assert done.returncode == 0, done.stderr
    with open_store(url) as s:
        h = s.get_hypervisor("c")
    assert {i.name: i.state for i in h.status.instances} == {"up": "running", "crashed": "crashed",
                                                             "off": "shutoff"}
    assert str(h.status.allocation["cpu"]) == "8"


def test_a_lease_past_a_day_is_refused_before_anything_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/h.db"
    done = hvfleet("agent", "--connect", "test:///default", "--lease-ttl", "2d", "--once", "--store", url)
    assert done.returncode == 2, done.stderr
    assert "--lease-ttl" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_second_agent_with_the_same_name_is_said_and_one_alone_is_not(tmp_path: Path) -> None:
    """Two agents started with the same --name on different hosts overwrote
    each other's status at every pass, silently (both hold the Lease as
    agent/NAME). Each now says so on stderr; an agent alone never does."""
    import signal
    import time

    from .conftest import fleet_uri, start_agent, stop

    url = f"sqlite:///{tmp_path}/h.db"
    alone = start_agent("--connect", fleet_uri("edge-01"), "--name", "solo", "--resync", "0.3s",
                        "--store", url)
    pair = [start_agent("--connect", fleet_uri(host), "--name", "shared", "--resync", "0.3s",
                        "--store", url) for host in ("edge-01", "lab-01")]
    try:
        time.sleep(6)
    finally:
        said = [stop(agent, signal.SIGTERM)[2] for agent in (alone, *pair)]
    assert "another agent writes" not in said[0], said[0]
    assert any("another agent writes the status of shared" in err for err in said[1:]), said[1:]
