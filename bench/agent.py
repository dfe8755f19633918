"""Node agent figures, each next to a peer measured in the same run.

1. Reconcile of a host with 500 domains (test-driver node file): libvirt read,
   parse (cold and warm cache), status build, store write, and the whole pass;
   peer: the bare libvirt read every agent pays (listAllDomains + XMLDesc).
2. Event-to-status latency on real QEMU (qemu:///embed, TCG): define/undefine
   and start/destroy of 64 MiB guests until the stored status shows it; peer:
   the time libvirt itself takes to deliver the lifecycle event.
3. RSS of the real `hvfleet agent` process on the 500-domain host; peer: a bare
   Python process holding an open libvirt connection.
4. Idle CPU of that agent process over a window; peer: the same window of the
   bare Python peer.

    .venv/bin/python bench/agent.py [--domains 500] [--events 60] [--idle-seconds 60]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import libvirt
from api import process_cpu as proc_cpu_seconds

from hvfleet.agent.observe import observe, read_host
from hvfleet.agent.reconcile import DomainParseCache, digest, reconcile
from hvfleet.agent.runner import Agent, AgentConfig
from hvfleet.agent.status_writer import StatusWriter
from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.discovery.libvirt_conn import LibvirtConnection, ensure_event_loop
from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.store import open_store

QEMU_CONF = """stdio_handler = "file"
user = "root"
group = "root"
security_driver = "none"
cgroup_controllers = [ ]
"""


def node_file(path: Path, domains: int) -> None:
    """A 4-cell, 128-CPU, 1 TiB host with `domains` guests in mixed shapes:
    unpinned, numatune-bound, vCPU-pinned, with guest NUMA cells, some shut off."""
    parts = [
        "<node><cpu><nodes>4</nodes><sockets>1</sockets><cores>16</cores><threads>2</threads>"
        "<mhz>2400</mhz><model>x86_64</model></cpu><memory>1073741824</memory>"
    ]
    for i in range(domains):
        extra = ""
        match i % 4:
            case 1:
                extra = f"<numatune><memory mode='strict' nodeset='{i % 4}'/></numatune>"
            case 2:
                extra = f"<cputune><vcpupin vcpu='0' cpuset='{i % 128}'/></cputune>"
            case 3:
                extra = (
                    "<cpu><numa><cell id='0' cpus='0' memory='512' unit='MiB'/>"
                    "<cell id='1' cpus='1' memory='512' unit='MiB'/></numa></cpu>"
                    "<numatune><memnode cellid='0' mode='strict' nodeset='0'/>"
                    "<memnode cellid='1' mode='strict' nodeset='1'/></numatune>"
                )
        state = "<test:runstate>5</test:runstate>" if i % 10 == 0 else ""
        parts.append(
            "<domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>"
            f"<name>vm-{i:04d}</name><uuid>00000000-0000-4000-8000-{i:012d}</uuid>"
            f"<memory unit='MiB'>1024</memory><vcpu>2</vcpu>{extra}"
            f"<os><type>hvm</type></os>{state}</domain>"
        )
    parts.append("</node>")
    path.write_text("\n".join(parts))


def median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:7.1f} ms"


def bench_reconcile(work: Path, domains: int, rounds: int = 7) -> None:
    node = work / "big-host.xml"
    node_file(node, domains)
    conn = LibvirtConnection(f"test://{node}")
    conn.open()
    host = read_host(conn)
    read, cold, warm, build, write, total = [], [], [], [], [], []
    with open_store(f"sqlite:///{work / 'reconcile.db'}") as store:
        writer = StatusWriter(store, "big-host", heartbeat_every=0)
        warm_cache = DomainParseCache()
        for _ in range(rounds):
            t0 = time.perf_counter()
            obs, _ = observe(conn, host)
            t1 = time.perf_counter()
            digest(obs, "defined", parse_host_capabilities, DomainParseCache())
            t2 = time.perf_counter()
            facts = digest(obs, "defined", parse_host_capabilities, warm_cache)
            t3 = time.perf_counter()
            now = datetime.now(UTC)
            reconcile(Hypervisor(metadata=ObjectMeta(name="big-host")), facts, now)
            t4 = time.perf_counter()
            writer.write(lambda h, f=facts: reconcile(h, f, datetime.now(UTC)))
            t5 = time.perf_counter()
            read.append(t1 - t0)
            cold.append(t2 - t1)
            warm.append(t3 - t2)
            build.append(t4 - t3)
            write.append(t5 - t4)
            total.append((t1 - t0) + (t3 - t2) + (t4 - t3) + (t5 - t4))
        h = store.get_hypervisor("big-host")
    conn.close()
    peer = statistics.median(read)
    print(f"Reconcile, test-driver host with {domains} domains ({len(h.status.instances)} "
          f"instances, {len(h.status.cells)} cells, allocation cpu {h.status.allocation['cpu'].value}), "
          f"median of {rounds}:")
    print(f"  libvirt read (listAllDomains + XMLDesc)   {median_ms(read)}   <- peer")
    print(f"  parse domains, cold cache                 {median_ms(cold)}")
    print(f"  parse domains, warm cache (resync)        {median_ms(warm)}")
    print(f"  build status (pipeline of steps)          {median_ms(build)}")
    print(f"  store write (SQLite, CAS)                 {median_ms(write)}")
    print(f"  whole pass, warm cache                    {median_ms(total)}"
          f"   = {statistics.median(total) / peer:.1f}x the libvirt read")
    print(f"  whole pass, cold cache                    "
          f"{(statistics.median(total) - statistics.median(warm) + statistics.median(cold)) * 1000:7.1f} ms")


def wait_store(store, name: str, pred, timeout: float = 10.0) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if pred(store.get_hypervisor(name)):
            return time.perf_counter()
        time.sleep(0.001)
    raise TimeoutError("status did not follow")


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def bench_events(work: Path, events: int) -> None:
    root = work / "embed"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "qemu.conf").write_text(QEMU_CONF)
    uri = f"qemu:///embed?root={root}"
    ensure_event_loop()
    conn = libvirt.open(uri)
    delivered: dict[str, float] = {}

    def on_event(_c, dom, _ev, _detail, _opaque) -> None:  # type: ignore[no-untyped-def]
        delivered.setdefault(dom.name(), time.perf_counter())

    conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, on_event, None)
    with open_store(f"sqlite:///{work / 'events.db'}") as store:
        agent = Agent(AgentConfig(uri=uri, name="embed-bench"), store)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        wait_store_first = time.perf_counter()
        while True:
            try:
                store.get_hypervisor("embed-bench")
                break
            except Exception:
                if time.perf_counter() - wait_store_first > 60:
                    raise
                time.sleep(0.05)
        lat: list[float] = []
        libvirt_lat: list[float] = []
        for i in range(events // 2):
            name = f"ev-{i}"
            xml = (f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>"
                   "<vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os>"
                   "<devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>")
            delivered.pop(name, None)
            t0 = time.perf_counter()
            dom = conn.defineXML(xml)
            t1 = wait_store(store, "embed-bench",
                            lambda h, n=name: any(x.name == n for x in h.status.instances))
            lat.append(t1 - t0)
            if name in delivered:
                libvirt_lat.append(delivered[name] - t0)
            delivered.pop(name, None)
            t0 = time.perf_counter()
            dom.undefine()
            t1 = wait_store(store, "embed-bench",
                            lambda h, n=name: all(x.name != n for x in h.status.instances))
            lat.append(t1 - t0)
            if name in delivered:
                libvirt_lat.append(delivered[name] - t0)
            time.sleep(0.02)
        run_lat: list[float] = []
        for i in range(5):
            name = f"run-{i}"
            dom = conn.defineXML(
                f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>"
                "<vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os>"
                "<devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>")
            time.sleep(0.3)
            t0 = time.perf_counter()
            dom.create()
            t1 = wait_store(store, "embed-bench", lambda h, n=name: any(
                x.name == n and x.state in ("running", "paused") for x in h.status.instances))
            run_lat.append(t1 - t0)
            dom.destroy()
            dom.undefine()
        stop.set()
        thread.join(5)
    conn.close()
    print(f"Event → status on qemu:///embed (TCG), {len(lat)} define/undefine events:")
    print(f"  agent: p50 {pct(lat, 50) * 1000:6.1f} ms   p99 {pct(lat, 99) * 1000:6.1f} ms   "
          f"max {max(lat) * 1000:6.1f} ms  (debounce waits 50 ms of quiet by design)")
    if libvirt_lat:
        print(f"  peer, libvirt event delivery: p50 {pct(libvirt_lat, 50) * 1000:6.1f} ms   "
              f"p99 {pct(libvirt_lat, 99) * 1000:6.1f} ms")
    print(f"  start of a real 64 MiB TCG guest (API call → status shows it): "
          f"p50 {pct(run_lat, 50) * 1000:6.1f} ms  max {max(run_lat) * 1000:6.1f} ms "
          f"(includes QEMU start)")


def proc_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def bench_process(work: Path, idle_seconds: float) -> None:
    node = work / "big-host.xml"
    hvfleet = str(Path(sys.executable).parent / "hvfleet")
    common = ["--connect", f"test://{node}", "--resync", "60s"]
    procs = {
        "hvfleet agent": subprocess.Popen(
            [hvfleet, "agent", "--name", "rss-cli", "--store", f"sqlite:///{work / 'a.db'}",
             *common], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "python -m hvfleet.agent": subprocess.Popen(
            [sys.executable, "-m", "hvfleet.agent", "--name", "rss-mod", "--store",
             f"sqlite:///{work / 'b.db'}", *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "peer: python + open libvirt connection": subprocess.Popen(
            [sys.executable, "-c",
             f"import libvirt, time; c = libvirt.open('test://{node}'); time.sleep(3600)"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    }
    try:
        for db, name in (("a.db", "rss-cli"), ("b.db", "rss-mod")):
            with open_store(f"sqlite:///{work / db}") as store:
                start = time.monotonic()
                while True:
                    try:
                        store.get_hypervisor(name)
                        break
                    except Exception:
                        if time.monotonic() - start > 60:
                            raise
                        time.sleep(0.1)
        time.sleep(2)
        cpu0 = {k: proc_cpu_seconds(p.pid) for k, p in procs.items()}
        time.sleep(idle_seconds)
        cpu1 = {k: proc_cpu_seconds(p.pid) for k, p in procs.items()}
        rss = {k: proc_rss_kib(p.pid) for k, p in procs.items()}
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(10)
    print(f"Agent processes on the {node.stem} host (SQLite store), idle window {idle_seconds:.0f} s:")
    for k in procs:
        used = cpu1[k] - cpu0[k]
        print(f"  {k:40s} RSS {rss[k] / 1024:6.1f} MiB   idle CPU {used:5.2f} CPU-s "
              f"= {used / idle_seconds * 100:4.1f}% of one core")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--domains", type=int, default=500)
    ap.add_argument("--events", type=int, default=60)
    ap.add_argument("--idle-seconds", type=float, default=60)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hvfleet-bench-agent-"))
    try:
        bench_reconcile(work, args.domains)
        print()
        bench_events(work, args.events)
        print()
        bench_process(work, args.idle_seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
