"""Benchmark: guest generation and CPU baseline, against their peers in the same run.

1. Guest generation: hvfleet `generate()` (in-process, warm) and the `hvfleet
   guest generate` command (one process per guest: with only the guest
   commands loaded, as the console script, with a cold data cache, and as
   the console script with `hvfleet worker` running) vs `virt-install
   --print-xml --dry-run` (Debian virtinst, one process per guest, on libvirt's
   test driver: virt-install cannot open qemu:///embed) for the same OS and
   resources.
2. CPU baseline over 10, 100 and 1000 hosts: hvfleet (parsing the same XML
   strings) vs libvirt-python `baselineCPU(..., EXPAND_FEATURES)` on
   `test:///default`, with a check that hvfleet's result is a superset of
   libvirt's (minus non-migratable features) and a subset of every host.

Usage: .venv/bin/python bench/guests.py [--quick] [--baseline-only]
(--baseline-only: part 2 alone, without the slow process-per-guest runs of part 1)
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libvirt
from lxml import etree

from hvfleet.guests.cpu import baseline_cpu, expand_cpu
from hvfleet.guests.cpumap import load_cpu_map
from hvfleet.guests.cpuxml import cpus_from_texts
from hvfleet.guests.generate import generate
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.osinfo import load_os_database
from hvfleet.guests.request import DiskSpec, GuestRequest, NicSpec

REPO = Path(__file__).resolve().parents[1]
HOSTS = REPO / "examples" / "hosts"
OSES = ("rhel9.1", "ubuntu22.04", "win2k22", "fedora37")
PY = sys.executable


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def bench_generate(quick: bool) -> None:
    group_dir = HOSTS / "groups" / "intel-mixed"
    t0 = time.perf_counter()
    load_os_database()
    load_cpu_map()
    group = load_caps_dir(str(group_dir))
    cold = time.perf_counter() - t0
    reps = 50 if quick else 250
    ours: list[float] = []
    for i in range(reps):
        os = OSES[i % len(OSES)]
        req = GuestRequest(
            os=os,
            name=f"bench{i}",
            vcpus=2,
            memory=4 << 30,
            disks=(DiskSpec.parse("kind=qcow2,source=/var/lib/img/b.qcow2"),),
            nics=(NicSpec.parse("network=default"),),
        )
        t = time.perf_counter()
        generate(req, group)
        ours.append(time.perf_counter() - t)

    def cli(os: str) -> list[str]:
        return [
            PY,
            "-c",
            "import hvfleet.cli.guest; from hvfleet.cli.main import app; app()",
            "guest",
            "generate",
            "--os",
            os,
            "--name",
            "b",
            "--vcpus",
            "2",
            "--memory",
            "4Gi",
            "--disk",
            "kind=qcow2,source=/var/lib/img/b.qcow2",
            "--nic",
            "network=default",
            "--caps-dir",
            str(group_dir),
        ]

    def virt_install(os: str) -> list[str]:
        return [
            "virt-install",
            "--connect",
            "test:///default",
            "--print-xml",
            "--dry-run",
            "--name",
            "b",
            "--osinfo",
            os,
            "--vcpus",
            "2",
            "--memory",
            "4096",
            "--disk",
            "path=/var/lib/img/b.qcow2,format=qcow2,size=1",
            "--network",
            "network=default",
            "--import",
            "--noautoconsole",
        ]

    procs = 4 if quick else 12
    script = str(Path(sys.executable).with_name("hvfleet"))
    rows: dict[str, list[float]] = {
        k: [] for k in ("floor", "imports", "family", "script", "worker", "cold", "virt-install")
    }
    with tempfile.TemporaryDirectory() as tmp:
        warm_env = {**os_env(), "HVFLEET_CACHE_DIR": f"{tmp}/warm"}
        subprocess.run(cli(OSES[0]), check=True, capture_output=True, env=warm_env)  # fill it
        worker_env = {**warm_env, "XDG_RUNTIME_DIR": f"{tmp}/run"}
        del worker_env["HVFLEET_WORKER"]
        subprocess.run([script, "worker", "start"], check=True, capture_output=True, env=worker_env)
        for i in range(procs):
            os = OSES[i % len(OSES)]
            runs = (
                ("floor", [PY, "-c", "import lxml.etree"], warm_env),
                ("imports", [PY, "-c", "import typer, lxml.etree, hvfleet.model.hostcaps"], warm_env),
                ("family", cli(os), warm_env),
                ("script", [script, *cli(os)[3:]], warm_env),
                ("worker", [script, *cli(os)[3:]], worker_env),
                ("cold", cli(os), {**os_env(), "HVFLEET_CACHE_DIR": f"{tmp}/cold{i}"}),
                ("virt-install", virt_install(os), os_env()),
            )
            for label, cmd, env in runs:
                t = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, env=env)
                rows[label].append(time.perf_counter() - t)
        subprocess.run([script, "worker", "stop"], check=True, capture_output=True, env=worker_env)
    ours_ms = median_ms(ours)
    vi_ms = median_ms(rows["virt-install"])
    print("## Guest generation (median per guest)")
    print(
        f"hvfleet generate(), in-process, warm: {ours_ms:8.3f} ms  "
        f"({1000 / ours_ms:8.0f} guests/s, {reps} guests, 3-host group)"
    )
    print(f"hvfleet one-time load (osinfo-db, cpu_map, caps): {cold * 1000:.0f} ms")
    print(f"virt-install --print-xml --dry-run, per process: {vi_ms:8.1f} ms  ({procs} runs)")
    for label, what in (
        ("family", "hvfleet guest generate, guest commands only, cache warm"),
        ("cold", "the same, cache cold (osinfo-db and cpu_map parsed)"),
        ("script", "hvfleet guest generate (console script, every command family)"),
        ("worker", "hvfleet guest generate (console script, hvfleet worker running)"),
        ("floor", "floor: python -c 'import lxml.etree'"),
        ("imports", "floor: python importing typer, lxml and hvfleet.model.hostcaps"),
    ):
        ms = median_ms(rows[label])
        print(f"{what}: {ms:8.1f} ms per process, {vi_ms / ms:5.1f}x virt-install's speed")
    print(f"ratio guests/s, hvfleet in-process vs virt-install: {vi_ms / ours_ms:8.0f}x")
    print()


def os_env() -> dict[str, str]:
    """The environment, with no user's own `hvfleet worker` in the way."""
    import os

    return {**os.environ, "HVFLEET_WORKER": "0"}


def _libvirt_features(xml: str) -> set[str]:
    root = etree.fromstring(xml.encode())
    return {
        f.get("name", "") for f in root.findall("feature") if f.get("policy") in (None, "require", "force")
    }


def bench_baseline(quick: bool) -> None:
    cmap = load_cpu_map()
    files = sorted((HOSTS / "cpus").glob("*.xml"))
    intel = [f.read_text() for f in files if "<vendor>Intel</vendor>" in f.read_text()]
    # A realistic fleet: mostly recent generations, a tail of older ones.
    recent = [x for x in intel if any(m in x for m in ("Skylake", "Cascadelake", "Icelake", "Cooperlake"))]
    conn = libvirt.open("test:///default")
    print("## CPU baseline (median)")
    print("input: 'same-hw' = hosts of one hardware type send identical <cpu> XML (the")
    print("domcapabilities host-model form); 'unique' = every host's XML differs (a")
    print("<microcode> line per host, as in `virsh capabilities`), the CPU definitions")
    print("repeat; 'distinct' = no two hosts share a CPU definition (3 random extra")
    print("features each); 'store' = host CPUs already parsed into")
    print("status.hostCapabilities (the --hosts path), no XML.")
    print(
        f"{'hosts':>6} {'input':>8} {'hvfleet ms':>11} {'libvirt ms':>11} {'speedup':>8} "
        f"{'hvfleet feats':>13} {'libvirt feats':>13} superset+within"
    )
    extra = sorted(cmap.features)
    for n in (10, 100, 1000):
        rng = random.Random(n)
        same = [rng.choice(recent) if rng.random() < 0.8 else rng.choice(intel) for _ in range(n)]
        unique = [x.replace("<arch>", f"<microcode version='{i}'/><arch>", 1) for i, x in enumerate(same)]
        # Worst case: no two hosts share a CPU definition (3 random extra
        # features each), so every document is parsed and expanded.
        distinct = [
            x.replace(
                "</cpu>",
                "".join(
                    f"<feature name='{f}'/>"
                    for f in rng.sample([f for f in extra if f'"{f}"' not in x and f"'{f}'" not in x], 3)
                )
                + "</cpu>",
            )
            for x in unique
        ]
        reps = 3 if quick else 15
        parsed = cpus_from_texts([(f"h{i}", x) for i, x in enumerate(unique)])
        for label, xmls in (("same-hw", same), ("unique", unique), ("distinct", distinct), ("store", None)):
            # libvirt always gets XML (it has no other input): same-hw texts
            # for the store row, the row's own texts otherwise.
            # Interleaved, libvirt then hvfleet in each round, so that the
            # machine's drift hits both alike; the speedup is the median of
            # the rounds' ratios.
            theirs_t: list[float] = []
            ours_t: list[float] = []
            theirs_xml = ""
            result = None
            named_row = [(f"h{i}", x) for i, x in enumerate(xmls or [])]
            for _ in range(reps):
                t = time.perf_counter()
                theirs_xml = conn.baselineCPU(xmls or same, libvirt.VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES)
                theirs_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                cpus = parsed if xmls is None else cpus_from_texts(named_row)
                result = baseline_cpu(cpus, cmap).value
                ours_t.append(time.perf_counter() - t)
            theirs = _libvirt_features(theirs_xml) - cmap.non_migratable
            lv = median_ms(theirs_t)
            speedup = statistics.median(a / b for a, b in zip(theirs_t, ours_t, strict=True))
            assert result is not None
            named = [(f"h{i}", x) for i, x in enumerate(xmls or [])]
            hosts_of_row = parsed if xmls is None else cpus_from_texts(named)
            ok = not (theirs - result.features) and all(
                result.features <= expand_cpu(c, cmap, h) for h, c in hosts_of_row
            )
            o = median_ms(ours_t)
            print(
                f"{n:>6} {label:>8} {o:>11.2f} {lv:>11.2f} {speedup:>7.1f}x "
                f"{len(result.features):>13} {len(theirs):>13} {ok}"
            )
    conn.close()


def main() -> None:
    quick = "--quick" in sys.argv
    if "--baseline-only" not in sys.argv:
        bench_generate(quick)
    bench_baseline(quick)


if __name__ == "__main__":
    main()
