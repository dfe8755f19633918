"""`hvfleet agent --once` against the libvirt test driver: test:///default and
every host of examples/fleet/, through the real command and a real SQLite
store. Every figure below is computed by hand from the XML files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hvfleet.model import Hypervisor
from hvfleet.store import open_store

from .conftest import FLEET, fleet_uri, hvfleet, quantities

C = quantities  # short: C({"cpu": "8", "memory": "16Gi"})

# host → (capacity, allocation, [(cell capacity, cell allocation)], {instance: state})
# Node files give no NUMA topology to libvirt's capabilities, so cells are the
# node info's NUMA count with CPUs in contiguous blocks and memory split evenly.
FLEET_DEFINED: dict[str, tuple[dict[str, str], dict[str, str], list[tuple[dict[str, str], dict[str, str]]], dict[str, str]]] = {  # noqa: E501
    # 1 cell, 8 CPUs, 16 GiB; web-1 2/2Gi, web-2 2/2Gi, batch-1 1/1Gi (shut off, still counted)
    "edge-01": (
        {"cpu": "8", "memory": "16Gi"}, {"cpu": "5", "memory": "5Gi"},
        [({"cpu": "8", "memory": "16Gi"}, {"cpu": "5", "memory": "5Gi"})],
        {"web-1": "running", "web-2": "running", "batch-1": "shutoff"},
    ),
    # 2 cells of 16 CPUs / 64 GiB. db-1 8/32Gi pinned to CPUs 0-7 and node 0;
    # app-1 4/8Gi unpinned → 2/4Gi each; app-2 4/8Gi with <vcpu cpuset='16-31'> →
    # cpu on cell 1, memory unbound → 4Gi each; cache-1 2/4Gi numatune node 1 →
    # cpu follows memory to cell 1.
    "compute-01": (
        {"cpu": "32", "memory": "128Gi"}, {"cpu": "18", "memory": "52Gi"},
        [({"cpu": "16", "memory": "64Gi"}, {"cpu": "10", "memory": "40Gi"}),
         ({"cpu": "16", "memory": "64Gi"}, {"cpu": "8", "memory": "12Gi"})],
        {"db-1": "running", "app-1": "running", "app-2": "running", "cache-1": "shutoff"},
    ),
    # big-1 16/64Gi with guest cells (0-7, 32Gi → node 0; 8-15, 32Gi → node 1);
    # web-3 2/4Gi and web-4 3/3Gi unpinned → 1 + 1.5 CPUs and 2 + 1.5 GiB per cell
    "compute-02": (
        {"cpu": "32", "memory": "128Gi"}, {"cpu": "21", "memory": "71Gi"},
        [({"cpu": "16", "memory": "64Gi"}, {"cpu": "10.5", "memory": "35.5Gi"}),
         ({"cpu": "16", "memory": "64Gi"}, {"cpu": "10.5", "memory": "35.5Gi"})],
        {"big-1": "running", "web-3": "shutoff", "web-4": "running"},
    ),
    # 5 x 8/16Gi unpinned (one paused) → 20/40Gi per cell
    "compute-03": (
        {"cpu": "64", "memory": "256Gi"}, {"cpu": "40", "memory": "80Gi"},
        [({"cpu": "32", "memory": "128Gi"}, {"cpu": "20", "memory": "40Gi"}),
         ({"cpu": "32", "memory": "128Gi"}, {"cpu": "20", "memory": "40Gi"})],
        {"ci-1": "running", "ci-2": "running", "ci-3": "running", "ci-4": "running",
         "ci-5": "paused"},
    ),
    # 4 cells of 24 CPUs / 256 GiB. sap-1 48/720Gi on nodes 0-2 → 16/240Gi each;
    # sap-2 16/128Gi on CPUs 72-87 and node 3; tools-1 2/4Gi unpinned → 0.5/1Gi each
    "bigmem-01": (
        {"cpu": "96", "memory": "1Ti"}, {"cpu": "66", "memory": "852Gi"},
        [({"cpu": "24", "memory": "256Gi"}, {"cpu": "16.5", "memory": "241Gi"}),
         ({"cpu": "24", "memory": "256Gi"}, {"cpu": "16.5", "memory": "241Gi"}),
         ({"cpu": "24", "memory": "256Gi"}, {"cpu": "16.5", "memory": "241Gi"}),
         ({"cpu": "24", "memory": "256Gi"}, {"cpu": "16.5", "memory": "129Gi"})],
        {"sap-1": "running", "sap-2": "running", "tools-1": "shutoff"},
    ),
    # 2 cells of 48 CPUs / 256 GiB. train-1 4/32Gi: vCPUs on 0,1 | 48,49, memory node 0;
    # train-2 2/16Gi: vCPU 0 on CPUs 2,50 (half each), vCPU 1 on CPU 3, memory 8Gi each;
    # infer-1 6/24Gi unpinned → 3/12Gi each
    "gpu-01": (
        {"cpu": "96", "memory": "512Gi"}, {"cpu": "12", "memory": "72Gi"},
        [({"cpu": "48", "memory": "256Gi"}, {"cpu": "6.5", "memory": "52Gi"}),
         ({"cpu": "48", "memory": "256Gi"}, {"cpu": "5.5", "memory": "20Gi"})],
        {"train-1": "running", "train-2": "running", "infer-1": "running"},
    ),
    # 2 of 4 CPUs online, 4 GiB; dev-1 1/512Mi, dev-2 1/768Mi (currentMemory 256Mi ignored)
    "lab-01": (
        {"cpu": "2", "memory": "4Gi"}, {"cpu": "2", "memory": "1280Mi"},
        [({"cpu": "2", "memory": "4Gi"}, {"cpu": "2", "memory": "1280Mi"})],
        {"dev-1": "running", "dev-2": "shutoff"},
    ),
}

# --count running: shut-off domains drop out
FLEET_RUNNING: dict[str, tuple[dict[str, str], list[dict[str, str]]]] = {
    "edge-01": ({"cpu": "4", "memory": "4Gi"}, [{"cpu": "4", "memory": "4Gi"}]),
    "compute-01": (
        {"cpu": "16", "memory": "48Gi"},
        [{"cpu": "10", "memory": "40Gi"}, {"cpu": "6", "memory": "8Gi"}],
    ),
    # the paused ci-5 still holds its resources
    "compute-03": (
        {"cpu": "40", "memory": "80Gi"},
        [{"cpu": "20", "memory": "40Gi"}, {"cpu": "20", "memory": "40Gi"}],
    ),
    "lab-01": ({"cpu": "1", "memory": "512Mi"}, [{"cpu": "1", "memory": "512Mi"}]),
}


def run_once(db: Path, uri: str, *extra: str) -> Hypervisor:
    out = hvfleet("agent", "--connect", uri, "--store", f"sqlite:///{db}", "--once", *extra)
    assert out.returncode == 0, out.stderr
    name = out.stdout.split(":", 1)[0]
    with open_store(f"sqlite:///{db}") as store:
        return store.get_hypervisor(name)


def test_fleet_has_at_least_six_hosts_of_different_shapes() -> None:
    assert sorted(p.stem for p in FLEET.glob("*.xml")) == sorted(FLEET_DEFINED)
    shapes = {(v[0]["cpu"], v[0]["memory"], len(v[2])) for v in FLEET_DEFINED.values()}
    assert len(shapes) >= 6


@pytest.mark.parametrize("host", sorted(FLEET_DEFINED))
def test_fleet_host_status_is_exact(tmp_path: Path, host: str) -> None:
    capacity, allocation, cells, instances = FLEET_DEFINED[host]
    h = run_once(tmp_path / "f.db", fleet_uri(host))
    assert h.name == host  # a node file's name, not the machine's host name
    s = h.status
    assert s.capacity == C(capacity)
    assert s.allocation == C(allocation)
    assert [(c.capacity, c.allocation) for c in s.cells] == [(C(a), C(b)) for a, b in cells]
    assert [c.id for c in s.cells] == list(range(len(cells)))
    assert {i.name: i.state for i in s.instances} == instances
    assert s.effective_capacity == C(capacity)  # no spec: ratio 1, nothing reserved
    assert [c.effective_capacity for c in s.cells] == [C(a) for a, _ in cells]
    conditions = {c.type: (c.status, c.reason) for c in s.conditions}
    assert conditions == {"LibvirtConnected": ("True", "Connected"), "Ready": ("True", "Reconciled"),
                          "Synced": ("True", "RatiosResolved")}
    assert s.last_heartbeat_time is not None
    assert h.spec.model_dump() == type(h.spec)().model_dump()


@pytest.mark.parametrize("host", sorted(FLEET_RUNNING))
def test_count_running_leaves_out_shut_off_domains(tmp_path: Path, host: str) -> None:
    allocation, cells = FLEET_RUNNING[host]
    h = run_once(tmp_path / "f.db", fleet_uri(host), "--count", "running")
    assert h.status.allocation == C(allocation)
    assert [c.allocation for c in h.status.cells] == [C(c) for c in cells]
    # instances still list every defined domain
    assert len(h.status.instances) == len(FLEET_DEFINED[host][3])


def test_test_default_is_exact(tmp_path: Path) -> None:
    h = run_once(tmp_path / "f.db", "test:///default", "--name", "default-host")
    s = h.status
    # cells 2 GiB (CPUs 0-7) + 4 GiB (CPUs 8-15); hugepage sizes listed with 0 pages
    zero_pages = {"hugepages-2Mi": "0", "hugepages-1Gi": "0"}
    assert s.capacity == C({"cpu": "16", "memory": "6Gi", **zero_pages})
    # domain "test": 2 vCPUs, <memory> 8 GiB (currentMemory 2 GiB does not count), unpinned
    assert s.allocation == C({"cpu": "2", "memory": "8Gi", **zero_pages})
    assert [c.capacity for c in s.cells] == [
        C({"cpu": "8", "memory": "2Gi", **zero_pages}),
        C({"cpu": "8", "memory": "4Gi", **zero_pages}),
    ]
    assert [c.allocation for c in s.cells] == [C({"cpu": "1", "memory": "4Gi", **zero_pages})] * 2
    assert [(i.uuid, i.name, i.state) for i in s.instances] == [
        ("6695eb01-f6a4-8304-79aa-97f2502e193f", "test", "running")
    ]
    assert s.instances[0].resources == C({"cpu": "2", "memory": "8Gi"})
    # the test driver has no domcapabilities: the object says so instead of guessing
    caps = s.host_capabilities
    assert caps is not None
    assert (caps.arch, caps.domain_types, caps.libvirt_version) == ("i686", ["test"], "9.0.0")
    assert caps.domcapabilities_available is False
    assert caps.tpm_models is None and caps.sev is None
    assert any("domcapabilities not available" in n for n in caps.notes)


def test_spec_set_before_the_agent_runs_shapes_effective_capacity(tmp_path: Path) -> None:
    from hvfleet.model import Hypervisor as H

    db = tmp_path / "f.db"
    with open_store(f"sqlite:///{db}") as store:
        store.create(
            H.model_validate({
                "metadata": {"name": "edge-01"},
                "spec": {"overcommit": {"cpu": 4, "memory": 1.5}, "reserved": {"memory": "2Gi"}},
            }),
            "operator",
        )
    h = run_once(db, fleet_uri("edge-01"))
    # cpu: 8 x 4 = 32; memory: (16Gi - 2Gi) x 1.5 = 21Gi
    assert h.status.effective_capacity == C({"cpu": "32", "memory": "21Gi"})
    assert h.status.cells[0].effective_capacity == C({"cpu": "32", "memory": "21Gi"})
    assert h.spec.overcommit == {"cpu": 4.0, "memory": 1.5}  # untouched by the agent
    managers = {e.manager for e in h.metadata.managed_fields}
    assert managers == {"operator", "agent/edge-01"}


def test_unparsable_domain_is_skipped_and_reported(tmp_path: Path) -> None:
    """A page size no page has (3 MiB) is refused; 16 MiB pages (POWER's,
    a size the host has no pool of) are counted, in their own resource."""
    node = tmp_path / "odd-01.xml"
    node.write_text("""<node>
  <cpu><nodes>1</nodes><sockets>1</sockets><cores>2</cores><threads>1</threads></cpu>
  <memory>4194304</memory>
  <domain type='test'><name>good</name><uuid>11111111-0000-0000-0000-000000000001</uuid>
    <memory unit='MiB'>512</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>
  <domain type='test'><name>odd-pages</name><uuid>11111111-0000-0000-0000-000000000002</uuid>
    <memory unit='MiB'>512</memory><vcpu>1</vcpu><os><type>hvm</type></os>
    <memoryBacking><hugepages><page size='3072' unit='KiB'/></hugepages></memoryBacking>
  </domain>
  <domain type='test'><name>power-pages</name><uuid>11111111-0000-0000-0000-000000000003</uuid>
    <memory unit='MiB'>512</memory><vcpu>1</vcpu><os><type>hvm</type></os>
    <memoryBacking><hugepages><page size='16384' unit='KiB'/></hugepages></memoryBacking>
  </domain>
</node>""")
    out = hvfleet("agent", "--connect", f"test://{node}", "--store",
                  f"sqlite:///{tmp_path / 'f.db'}", "--once")
    assert out.returncode == 0, out.stderr
    assert "skipping domain odd-pages" in out.stderr
    with open_store(f"sqlite:///{tmp_path / 'f.db'}") as store:
        h = store.get_hypervisor("odd-01")
    assert h.status.allocation == C({"cpu": "2", "memory": "512Mi", "hugepages-16Mi": "512Mi"})
    assert [i.name for i in h.status.instances] == ["good", "power-pages"]
    ready = next(c for c in h.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "UnparsableDomains")
    assert "odd-pages" in ready.message and "3072 KiB is not a power of two" in ready.message
    assert "power-pages" not in ready.message


def test_python_m_hvfleet_agent_is_the_same_command(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hvfleet", "agent", "--connect", fleet_uri("lab-01"), "--store",
         f"sqlite:///{tmp_path / 'f.db'}", "--once"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("lab-01: cpu 2/2, memory 1.2Gi/4Gi")  # binary units, readable (issue 19)


def test_once_exits_1_with_one_line_when_libvirt_is_unreachable(tmp_path: Path) -> None:
    out = hvfleet("agent", "--connect", f"qemu:///system?socket={tmp_path}/no-such-sock",
                  "--name", "x", "--store", f"sqlite:///{tmp_path / 'f.db'}", "--once")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: libvirt qemu:///system?socket=")
    assert "cannot connect" in last


def test_bad_options_exit_2(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'f.db'}"
    for extra in (["--resync", "soon"], ["--count", "some"], ["--metrics-addr", "nope"],
                  ["--name", "Bad_Name"]):
        out = hvfleet("agent", "--connect", "test:///default", "--store", store, "--once", *extra)
        assert out.returncode == 2, (extra, out.stderr)
        assert out.stderr.startswith("error: --"), out.stderr
