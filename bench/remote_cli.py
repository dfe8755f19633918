"""`hvfleet get hypervisors` against an `hvfleet serve`, next to kubectl's
`get hypervisors` against the same server, whole processes, interleaved.

Each `hvfleet` row is measured twice: as its own process (HVFLEET_WORKER=0)
and with `hvfleet worker` running (the console script hands the command to
the warm worker's forked child: worker/launch.py). Also, as a second peer, the
same `hvfleet get` on the server's SQLite file directly, and in-process:
`RemoteStore.list` vs `SqliteStore.list` of the same fleet. The server is
the real `hvfleet serve` (TLS, token authentication, role authorization,
audit log to a file) over SQLite holding `--hosts` Hypervisors with agent
status; both clients use one viewer kubeconfig.

    .venv/bin/python bench/remote_cli.py [--hosts 200] [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hvfleet.model import Hypervisor
from hvfleet.store import open_store
from hvfleet.store.kubeconfig import dump_kubeconfig, render_kubeconfig
from hvfleet.store.ownership import agent_manager
from hvfleet.store.remote import RemoteStore
from hvfleet.store.tokens import issue_token

BIN = Path(sys.executable).parent
HVFLEET = str(BIN / "hvfleet")
KUBECTL = str(BIN / "kubectl") if (BIN / "kubectl").exists() else (shutil.which("kubectl") or "kubectl")


def fill(url: str, hosts: int) -> str:
    with open_store(url) as s:
        now = datetime.now(UTC)
        for i in range(hosts):
            name = f"hv{i:05d}"
            meta = {"name": name, "labels": {"az": f"az{i % 3}"}}
            h = s.create(Hypervisor.model_validate({"metadata": meta}), "bench")
            assert isinstance(h, Hypervisor)
            status = h.status.model_copy(update={
                "capacity": {"cpu": 64, "memory": "256Gi"}, "allocation": {"cpu": i % 64},
                "last_heartbeat_time": now})
            s.update(h.model_copy(update={"status": status}), agent_manager(name))
        _, token = issue_token(s, "viewer", manager="bench", now=now, ttl=timedelta(hours=1), name="bench")
    return token


def serve(store_url: str, tmp: Path) -> tuple[subprocess.Popen[str], str, Path]:
    proc = subprocess.Popen([HVFLEET, "serve", "--store", store_url, "--listen", "127.0.0.1:0",
                             "--data-dir", str(tmp / "data"), "--audit-log", str(tmp / "audit.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    m = re.match(r"hvfleet serve: (https://\S+) over ", proc.stdout.readline())
    ca_line = proc.stdout.readline()
    if m is None or not ca_line.startswith("CA certificate: "):
        proc.kill()
        raise SystemExit(f"serve did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc, m[1], Path(ca_line.removeprefix("CA certificate: ").strip())


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed: {r.stderr}")
    return took


def median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=200)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        store_url = f"sqlite:///{tmp}/hvfleet.db"
        token = fill(store_url, args.hosts)
        proc, url, ca = serve(store_url, tmp)
        try:
            config = tmp / "kubeconfig"
            config.write_text(dump_kubeconfig(render_kubeconfig(url, token, ca.read_bytes())))
            alone = {**os.environ, "HVFLEET_WORKER": "0"}
            warm = {**os.environ, "XDG_RUNTIME_DIR": str(tmp / "run")}
            warm.pop("HVFLEET_WORKER", None)
            subprocess.run([HVFLEET, "worker", "start"], env=warm, check=True, capture_output=True)
            api_get = [HVFLEET, "get", "hypervisors", "--store", url, "--kubeconfig", str(config)]
            direct_get = [HVFLEET, "get", "hypervisors", "--store", store_url]
            commands = {
                "hvfleet get hypervisors --store https://… (API)": (api_get, alone),
                "kubectl get hypervisors (same server)":
                    ([KUBECTL, "--kubeconfig", str(config), "get", "hypervisors"], alone),
                "the same hvfleet get, hvfleet worker running": (api_get, warm),
                "hvfleet get hypervisors --store sqlite:/// (direct)": (direct_get, alone),
                "the same, hvfleet worker running": (direct_get, warm),
            }
            for cmd, env in commands.values():
                timed(cmd, env)  # warm the page cache and the server
            samples: dict[str, list[float]] = {k: [] for k in commands}
            for _ in range(args.runs):  # interleaved: the machine's noise hits all alike
                for label, (cmd, env) in commands.items():
                    samples[label].append(timed(cmd, env))
            subprocess.run([HVFLEET, "worker", "stop"], env=warm, check=True, capture_output=True)
            print(f"{args.hosts} hypervisors, {args.runs} runs each, whole process, median:")
            medians = {k: statistics.median(v) * 1000 for k, v in samples.items()}
            for label, ms in medians.items():
                print(f"  {label:<52} {ms:8.1f} ms")
            api, kube, api_warm = list(medians.values())[:3]
            print(f"  hvfleet / kubectl: {api / kube:.2f}x as its own process, "
                  f"{api_warm / kube:.2f}x with the worker (aim: within 2x)")
            remote = RemoteStore(url, token, ca.read_bytes())
            with open_store(store_url) as direct:
                r = median_ms(lambda: remote.list("Hypervisor"), args.runs)
                s = median_ms(lambda: direct.list("Hypervisor"), args.runs)
            remote.close()
            print(f"  in-process list: RemoteStore {r:.1f} ms, SqliteStore {s:.1f} ms")
        finally:
            proc.terminate()
            proc.wait(15)


if __name__ == "__main__":
    main()
