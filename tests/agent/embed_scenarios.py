"""Scenarios against real QEMU (qemu:///embed, TCG), each run in a fresh Python
process by test_agent_qemu.py.

Why a separate process: libvirt lets a process open exactly one embedded QEMU
root, for its whole life, and once the embedded driver is loaded a plain
`qemu:///system` no longer reaches libvirtd from that process. Other test
packages use their own embed roots, so sharing the pytest process would make
the suite depend on test order.

    python -m tests.agent.embed_scenarios SCENARIO EMBED_ROOT STORE_DB
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import libvirt

from hvfleet.agent.runner import Agent, AgentConfig
from hvfleet.discovery.libvirt_conn import ensure_event_loop
from hvfleet.model import Hypervisor
from hvfleet.model.hypervisor import CountMode
from hvfleet.model.resources import ResourceName
from hvfleet.store import open_store
from hvfleet.store.base import Store

from .waiting import wait_for as wait_until

if TYPE_CHECKING:
    import requests

MI = 2**20
R_CPU, R_MEMORY = ResourceName("cpu"), ResourceName("memory")


def wait_for(
    store: Store, name: str, pred: Callable[[Hypervisor], bool], timeout: float
) -> tuple[float, Hypervisor]:
    # In the child process any store error is "not there yet": the agent and
    # its embedded QEMU start up beside the polling.
    return wait_until(store, name, pred, timeout, tolerate=(Exception,))


QEMU_CONF = """stdio_handler = "file"
user = "root"
group = "root"
security_driver = "none"
cgroup_controllers = [ ]
"""

TINY = """<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>{vcpus}</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices>
</domain>"""


def start_agent(embed_uri: str, store: Store, name: str, count: CountMode) -> tuple[
    Agent, threading.Event, threading.Thread
]:
    agent = Agent(AgentConfig(uri=embed_uri, name=name, count=count), store)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    return agent, stop, thread


def events_and_spec(embed_uri: str, conn: libvirt.virConnect, store: Store) -> None:
    """A 64 MiB TCG guest defined, started, destroyed, undefined: allocation
    follows within 2 s each time, for an agent counting defined domains and one
    counting running ones; overcommit cpu=4 → effectiveCapacity within 2 s;
    stop → run() returns within 2 s."""
    defined = start_agent(embed_uri, store, "embed-defined", "defined")
    running = start_agent(embed_uri, store, "embed-running", "running")
    try:
        _, h = wait_for(store, "embed-defined", lambda h: bool(h.status.capacity), 60)
        wait_for(store, "embed-running", lambda h: bool(h.status.capacity), 60)
        capacity_cpu = h.status.capacity["cpu"]
        caps = h.status.host_capabilities
        assert caps is not None and caps.domcapabilities_available
        assert caps.arch == "x86_64" and "qemu" in caps.domain_types
        assert caps.libvirt_version == "9.0.0"
        # the exact QEMU version from the connection, e.g. 7.2.22, not one inferred
        assert caps.hypervisor_version.count(".") == 2
        assert caps.hypervisor_version.startswith("7.2.")
        base_cpu, base_mem = h.status.allocation["cpu"], h.status.allocation["memory"]

        def allocation_is(name: str, cpu: int, mem: int) -> Hypervisor:
            _, got = wait_for(
                store, name,
                lambda h: h.status.allocation["cpu"] == cpu
                and h.status.allocation["memory"] == mem,
                2.0,
            )
            return got

        dom = conn.defineXML(TINY.format(name="tiny-1", vcpus=2))
        h = allocation_is("embed-defined", base_cpu + 2, base_mem + 64 * MI)
        (inst,) = [i for i in h.status.instances if i.name == "tiny-1"]
        assert (inst.uuid, inst.state) == (dom.UUIDString(), "shutoff")
        assert inst.resources == {"cpu": 2, "memory": 64 * MI}
        # one host cell here: the whole guest lands on it
        assert h.status.cells[0].allocation["cpu"] == base_cpu + 2
        # a shut-off guest is listed, but holds nothing for the agent counting running ones
        _, h = wait_for(store, "embed-running", lambda h: any(
            i.name == "tiny-1" and i.state == "shutoff" for i in h.status.instances), 2.0)
        assert (h.status.allocation["cpu"], h.status.allocation["memory"]) == (base_cpu, base_mem)

        dom.create()
        h = allocation_is("embed-running", base_cpu + 2, base_mem + 64 * MI)
        assert h.status.cells[0].allocation["memory"] == base_mem + 64 * MI
        wait_for(store, "embed-defined", lambda h: any(
            i.name == "tiny-1" and i.state == "running" for i in h.status.instances), 2.0)

        # Pinning a vCPU emits no lifecycle event, only a tunable one; the agent
        # re-reads libvirt for it (cells follow pinning).
        agent = defined[0]
        seen = agent.observations
        dom.pinVcpu(0, (True,) + (False,) * (capacity_cpu.floor() - 1))
        deadline = time.monotonic() + 2.0
        while agent.observations == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert agent.observations > seen, "no re-read after a vCPU pinning change"

        dom.destroy()
        allocation_is("embed-running", base_cpu, base_mem)
        allocation_is("embed-defined", base_cpu + 2, base_mem + 64 * MI)
        dom.undefine()
        h = allocation_is("embed-defined", base_cpu, base_mem)
        assert all(i.name != "tiny-1" for i in h.status.instances)

        # An operator runs the real command against the same store.
        hvfleet = Path(sys.executable).parent / "hvfleet"
        out = subprocess.run(
            [str(hvfleet), "overcommit", "set", "embed-defined", "cpu=4", "--store", store.url],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        _, h = wait_for(
            store, "embed-defined",
            lambda h: h.status.effective_capacity["cpu"] == 4 * capacity_cpu,
            2.0,
        )
        assert h.status.cells[0].effective_capacity["cpu"] == 4 * capacity_cpu
        assert h.status.observed_generation == h.metadata.generation
        assert h.spec.overcommit == {"cpu": 4.0}
        # the other host's spec is untouched, and so is its effective capacity
        assert store.get_hypervisor("embed-running").status.effective_capacity["cpu"] == (
            capacity_cpu)
    finally:
        started = time.monotonic()
        for _, stop, _ in (defined, running):
            stop.set()
        for _, _, thread in (defined, running):
            thread.join(5)
            assert not thread.is_alive()
    assert time.monotonic() - started < 2.0


def burst(embed_uri: str, conn: libvirt.virConnect, store: Store) -> None:
    """20 defines in a quick burst → far fewer status writes."""
    agent = Agent(AgentConfig(uri=embed_uri, name="burst-host"), store)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(store, "burst-host", lambda h: bool(h.status.capacity), 60)
        rv_before = int(store.get_hypervisor("burst-host").metadata.resource_version or 0)
        writes_before = agent.reconciles
        for i in range(20):
            conn.defineXML(TINY.format(name=f"burst-{i}", vcpus=1))
        wait_for(
            store, "burst-host",
            lambda h: sum(1 for i in h.status.instances if i.name.startswith("burst-")) == 20,
            2.0,
        )
        # 20 define events in a quick burst: far fewer than 20 status writes
        assert agent.reconciles - writes_before <= 10
        assert int(store.get_hypervisor("burst-host").metadata.resource_version or 0) > rv_before
    finally:
        stop.set()
        thread.join(5)


# A boot sector that panics through pvpanic once per QEMU process: it marks
# CMOS byte 0x40 (kept across the guest resets of on_crash=restart), and only
# when the mark is not there yet writes 1 (PANICKED) to the pvpanic port 0x505.
# Then it halts. SeaBIOS loads it from the first disk at 0x7c00.
PANIC_BOOT_SECTOR = bytes.fromhex(
    "b040e670e4713c5a740e"  # mov al,0x40; out 0x70,al; in al,0x71; cmp al,0x5a; je halt
    "b040e670b05ae671"  # mov al,0x40; out 0x70,al; mov al,0x5a; out 0x71,al
    "b001ba0505ee"  # mov al,1; mov dx,0x505; out dx,al   (pvpanic: guest panicked)
    "faf4ebfc"  # halt: cli; hlt; jmp halt
).ljust(510, b"\0") + b"\x55\xaa"


def guest_crash(embed_uri: str, conn: libvirt.virConnect, store: Store) -> None:
    """A guest generated by policy 2026.2 for this host, whose boot sector
    panics through its pvpanic device: libvirt's lifecycle CRASHED reaches the
    agent, which records crashCount/lastCrashTime on the instance and counts it
    in hvfleet_guest_crashes; with the host's dump location reported,
    the generated on_crash is coredump-restart and a core dump appears there."""
    from hvfleet.agent.metrics import AgentMetrics
    from hvfleet.discovery.capabilities import parse_host_capabilities
    from hvfleet.guests.generate import generate
    from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup

    root = Path(embed_uri.split("root=", 1)[1])
    dump_dir = root / "dump"
    disk = root / "panic.raw"
    disk.write_bytes(PANIC_BOOT_SECTOR.ljust(1 << 20, b"\0"))
    metrics = AgentMetrics("crash-host")
    agent = Agent(AgentConfig(uri=embed_uri, name="crash-host", dump_location=str(dump_dir)),
                  store, metrics)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _, h = wait_for(store, "crash-host", lambda h: bool(h.status.capacity), 60)
        stored = h.status.host_capabilities
        assert stored is not None and stored.dump_location == str(dump_dir)
        caps = parse_host_capabilities(
            conn.getCapabilities(),
            conn.getDomainCapabilities(None, "x86_64", "q35", "qemu", 0),
        ).model_copy(update={"dump_location": stored.dump_location})
        xml, plan = generate(
            GuestRequest(os="rhel9.1", name="crashy", vcpus=1, memory=128 << 20,
                         disks=(DiskSpec.parse(f"kind=raw,source={disk}"),), policy="2026.2"),
            HostGroup((("crash-host", caps),)),
        )
        assert plan.panic.value == "isa", plan.panic
        assert plan.lifecycle.value[2] == "coredump-restart", plan.lifecycle
        dom = conn.defineXML(xml)
        dom.create()
        _, h = wait_for(store, "crash-host", lambda h: any(
            i.name == "crashy" and (i.crash_count or 0) >= 1 for i in h.status.instances), 60)
        (inst,) = [i for i in h.status.instances if i.name == "crashy"]
        assert inst.last_crash_reason == "panicked" and inst.last_crash_time is not None
        value = metrics.registry.get_sample_value(
            "hvfleet_guest_crashes_total", {"hypervisor": "crash-host", "domain": "crashy"})
        assert value is not None and value >= 1, value
        deadline = time.monotonic() + 60
        while not any(dump_dir.glob("*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any(dump_dir.glob("*")), f"no core dump in {dump_dir}"
        dom.destroy()
        # a destroyed guest keeps its crash record; a later pass does not double it
        count = inst.crash_count
        _, h = wait_for(store, "crash-host", lambda h: any(
            i.name == "crashy" and i.state == "shutoff" for i in h.status.instances), 10)
        (after,) = [i for i in h.status.instances if i.name == "crashy"]
        assert after.crash_count is not None and after.crash_count >= (count or 0)
        print(f"crash recorded: {after.crash_count} crash(es), last {after.last_crash_time}")
    finally:
        stop.set()
        thread.join(5)


@contextlib.contextmanager
def placement_api(store: Store) -> Iterator[Callable[..., requests.Response]]:
    """`hvfleet serve`'s app over `store` on TLS for the block, and a
    Placement client of it: placement(method, path, body=None) with an admin
    token, as Nova sends it (microversion 1.39)."""
    import json
    import tempfile
    from datetime import UTC, datetime

    import requests

    from hvfleet.server.app import create_app
    from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
    from hvfleet.store.tokens import issue_token
    from tests.server.running import ServerThread
    from tests.server.tls_files import make_tls_files

    _, token = issue_token(store, "admin", manager="test", now=datetime.now(UTC), ttl=None, name="nova")
    app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
    files = make_tls_files(Path(tempfile.mkdtemp()) / "tls")
    with ServerThread(app, files) as server:
        def placement(method: str, path: str, body: object = None) -> requests.Response:
            return requests.request(method, f"{server.url}/placement{path}", verify=str(files.ca), timeout=30,
                                    data=None if body is None else json.dumps(body), headers={
                                        "X-Auth-Token": token, "OpenStack-API-Version": "placement 1.39",
                                        "Content-Type": "application/json", "Accept": "application/json"})

        yield placement


def placement_claim(embed_uri: str, conn: libvirt.virConnect, store: Store) -> None:
    """A claim made through hvfleet's Placement API (PUT /allocations, as
    Nova's scheduler makes it) for an instance that is not defined yet holds
    its cpu, memory and a VGPU (extraCapacity: libvirt cannot see it). When
    the consumer's domain appears in libvirt, the agent's allocation counts
    its cpu and memory and the claim no longer does: counted once, in free
    capacity and in Placement's usages, while GET /allocations still shows
    the allocation Nova made; the VGPU stays held while the instance exists,
    and nothing is held once it is gone and Nova deleted its allocation."""
    import uuid
    from datetime import UTC, datetime

    from hvfleet.model.capacity import free_capacity

    name = "claim-host"
    agent = Agent(AgentConfig(uri=embed_uri, name=name), store)  # counts defined domains
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    with placement_api(store) as placement:
        def free() -> dict[str, int]:
            h = store.get_hypervisor(name)
            got = free_capacity(h, store.list_reservations(), datetime.now(UTC))
            return {str(r): got[r].floor() for r in ("cpu", "memory", "VGPU")}

        try:
            wait_for(store, name, lambda h: bool(h.status.capacity), 60)

            def with_vgpus(h: Hypervisor) -> Hypervisor:
                extra = {**h.spec.extra_capacity, "VGPU": 2}
                return h.model_copy(update={"spec": h.spec.model_copy(update={"extra_capacity": extra})})

            store.update_hypervisor(name, with_vgpus, "test")
            h = store.get_hypervisor(name)
            uid = h.metadata.uid
            empty = free()
            assert empty["VGPU"] == 2, empty
            consumer = str(uuid.uuid4())
            r = placement("PUT", f"/allocations/{consumer}", {
                "allocations": {uid: {"resources": {"VCPU": 2, "MEMORY_MB": 64, "VGPU": 1}}},
                "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
                "consumer_generation": None, "consumer_type": "INSTANCE"})
            assert r.status_code == 204, r.text
            claimed = free()
            assert claimed == {"cpu": empty["cpu"] - 2, "memory": empty["memory"] - 64 * MI, "VGPU": 1}, \
                (empty, claimed)
            base = placement("GET", f"/resource_providers/{uid}/usages").json()["usages"]

            xml = TINY.format(name="claimed-vm", vcpus=2).replace(
                "<name>claimed-vm</name>", f"<name>claimed-vm</name><uuid>{consumer}</uuid>")
            dom = conn.defineXML(xml)
            _, h = wait_for(store, name, lambda h: any(i.uuid == consumer for i in h.status.instances), 5.0)
            # libvirt's allocation now has the guest's 2 cpus and 64 MiB; the claim holds only the VGPU.
            assert free() == claimed, (claimed, free())
            now = placement("GET", f"/resource_providers/{uid}/usages").json()["usages"]
            assert now == base, (base, now)
            got = placement("GET", f"/allocations/{consumer}").json()
            assert got["allocations"][uid]["resources"] == {"VCPU": 2, "MEMORY_MB": 64, "VGPU": 1}, got
            on_rp = placement("GET", f"/resource_providers/{uid}/allocations").json()["allocations"]
            assert on_rp[consumer]["resources"] == {"VCPU": 2, "MEMORY_MB": 64, "VGPU": 1}, on_rp

            # Nova deletes the instance, then its allocation: nothing is held any more.
            dom.undefine()
            wait_for(store, name, lambda h: all(i.uuid != consumer for i in h.status.instances), 5.0)
            assert placement("DELETE", f"/allocations/{consumer}").status_code == 204
            assert free() == empty, (empty, free())
            assert [r for r in store.list_reservations() if r.spec.consumer == consumer] == []
        finally:
            stop.set()
            thread.join(5)


def shutoff_claim(count: CountMode, embed_uri: str, conn: libvirt.virConnect, store: Store) -> None:
    """A claim (PUT /allocations through hvfleet's Placement API) for a guest
    that is defined but shut off, larger than the guest: under `--count
    running` libvirt's allocation leaves the guest out, so the claim holds
    all it asks; under `--count defined` the allocation counts the guest and
    the claim holds only what exceeds it. Either way the guest and its claim
    count once, at the claim's size, in free capacity, `fit`, the capacity
    view and Placement's usages, and stay so when the guest starts and stops
    again; another consumer's claim for what is left plus one CPU is
    refused (`hvfleet reserve`'s check)."""
    import uuid
    from datetime import UTC, datetime

    from hvfleet.model.capacity import free_capacity
    from hvfleet.model.errors import HvfleetError
    from hvfleet.model.quantity import Quantity
    from hvfleet.ops.fit import FitQuery, fit
    from hvfleet.scheduling.claims import reserve
    from hvfleet.scheduling.index import FleetIndex
    from hvfleet.scheduling.request import parse_request
    from hvfleet.views import fleet_summary

    name = f"shutoff-{count}"
    _, stop, thread = start_agent(embed_uri, store, name, count)
    with placement_api(store) as placement:
        def views() -> tuple[dict[str, int], ...]:
            """free cpu and memory (MiB) as free capacity, fit and the
            capacity view have them, and the provider's Placement usages."""
            now = datetime.now(UTC)
            h = store.get_hypervisor(name)
            got = free_capacity(h, store.list_reservations(), now)
            model = {"cpu": got[R_CPU].floor(), "memory": got[R_MEMORY].floor() // MI}
            answer = fit(FleetIndex.from_store(store), FitQuery.from_plain({"memory": "1Mi"}))
            [candidate] = answer.document()["candidates"]
            fitted = {"cpu": Quantity.parse(candidate["free"]["cpu"]).floor(),
                      "memory": Quantity.parse(candidate["free"]["memory"]).floor() // MI}
            summary = fleet_summary([h], store.list_reservations(), store.agent_liveness(), now)
            [row] = summary.to_dict()["hosts"]
            viewed = {"cpu": Quantity.parse(row["free"]["cpu"]).floor(),
                      "memory": Quantity.parse(row["free"]["memory"]).floor() // MI}
            usages = placement("GET", f"/resource_providers/{h.metadata.uid}/usages").json()["usages"]
            return model, fitted, viewed, {"cpu": usages.get("VCPU", 0), "memory": usages.get("MEMORY_MB", 0)}

        try:
            _, h = wait_for(store, name, lambda h: bool(h.status.capacity), 60)
            cpus = h.status.capacity[R_CPU].floor()
            memory = h.status.capacity[R_MEMORY].floor() // MI
            guest = str(uuid.uuid4())
            xml = TINY.format(name=f"off-{count}", vcpus=1).replace(
                f"<name>off-{count}</name>", f"<name>off-{count}</name><uuid>{guest}</uuid>")
            dom = conn.defineXML(xml)  # 1 vCPU, 64 MiB, shut off
            _, h = wait_for(store, name, lambda h: any(i.uuid == guest for i in h.status.instances), 5.0)
            assert h.status.count_mode == count, h.status.count_mode
            in_allocation = 1 if count == "defined" else 0
            assert h.status.allocation[R_CPU] == in_allocation, h.status.allocation

            # The claim: every CPU of the host (its max_unit) and 128 MiB.
            r = placement("PUT", f"/allocations/{guest}", {
                "allocations": {h.metadata.uid: {"resources": {"VCPU": cpus, "MEMORY_MB": 128}}},
                "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
                "consumer_generation": None, "consumer_type": "INSTANCE"})
            assert r.status_code == 204, r.text
            # The guest and its claim count once, at the claim's size.
            expected = ({"cpu": 0, "memory": memory - 128},) * 3 + ({"cpu": cpus, "memory": 128},)
            assert views() == expected, (count, views(), expected)
            # Nothing is left for another consumer's CPU.
            try:
                reserve(store, name, parse_request("1", None), str(uuid.uuid4()))
            except HvfleetError as exc:
                assert "cpu" in str(exc), exc
            else:
                raise AssertionError(f"a claim of 1 cpu fit beside the shut-off guest's claim ({count})")

            dom.create()  # the guest runs: libvirt's allocation counts it in either mode
            wait_for(store, name, lambda h: h.status.allocation[R_CPU] == 1, 10.0)
            assert views() == expected, (count, "running", views(), expected)
            dom.destroy()  # shut off again
            wait_for(store, name, lambda h: h.status.allocation[R_CPU] == in_allocation
                     and any(i.uuid == guest and i.state == "shutoff" for i in h.status.instances), 10.0)
            assert views() == expected, (count, "shut off again", views(), expected)
            print(f"{count}: claim of {cpus} cpu, 128 MiB beside a shut-off guest of 1 cpu, 64 MiB: "
                  f"free {expected[0]}, usages {expected[3]}")
            dom.undefine()
        finally:
            stop.set()
            thread.join(5)


SCENARIOS: dict[str, Callable[[str, libvirt.virConnect, Store], None]] = {
    "placement_claim": placement_claim,
    "shutoff_claim_running": functools.partial(shutoff_claim, "running"),
    "shutoff_claim_defined": functools.partial(shutoff_claim, "defined"),
    "events_and_spec": events_and_spec,
    "burst": burst,
    "guest_crash": guest_crash,
}


def main() -> None:
    scenario, root, db = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "qemu.conf").write_text(QEMU_CONF + f'auto_dump_path = "{root}/dump"\n')
    (root / "dump").mkdir(exist_ok=True)
    uri = f"qemu:///embed?root={root}"
    ensure_event_loop()
    conn = libvirt.open(uri)
    try:
        with open_store(f"sqlite:///{db}") as store:
            SCENARIOS[scenario](uri, conn, store)
    finally:
        for dom in conn.listAllDomains(0):
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        conn.close()
    print(f"scenario {scenario}: ok")


if __name__ == "__main__":
    main()
