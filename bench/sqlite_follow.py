"""CPU of an `hvfleet serve` over SQLite per host write it follows, with the
readers a fleet has open: `--watches` API watches of hypervisors (viewer
tokens, streamed over HTTPS and read to the end of each line), and a
scheduler asking `GET /placement/allocation_candidates` and `POST .../fit`
every `--ask-every` seconds (each catches the fleet index and the Placement
snapshot up with the writes since the last one).

The writes are status writes (a new heartbeat and allocation) of the
synthetic fleet's hosts (tests/dashboard/synthetic.py, `--hosts`), paced at
`--rate` per second for `--seconds`:
- `--via direct` (the default): straight into the SQLite file from this
  process, as another process on the same file writes (`hvfleet` commands
  with `--store sqlite://…`, a second server): the server only follows them;
- `--via api`: PUT …/status through the server with each host's agent token
  (the first `--agents` hosts, in turn): the server's own writes, the
  request's handling included.

The figure is the server process's CPU (user + sys of every thread,
/proc/PID/stat) over the writing window, per write, with the window's idle
CPU (the same readers, nothing written) measured before and taken off.
With `--base DIR` (another checkout), a server from DIR's `src` runs beside
this checkout's, each over its own copy of the fleet, both written and read
in the same seconds of each round (so the machine's load hits both alike);
the figure is the median over `--rounds`, and the ratio head / base. With
`--via direct` this process writes with this checkout's model code: when the
base's model code differs, its server cannot vouch for those values (their
seal is another code's) and decodes them all, so compare `--via api` then
(the script says so).

With `--history-behind SECONDS`, every host already has that much history
in the store (each side's code seeds it as that code keeps it), and the
idle CPU is not taken off: the sampler writing the touched hosts' series at
each bucket is the writes' own cost, and it runs in the "idle" window too;
give `--seconds 60` or more so that the window holds a 1 min bucket.

    .venv/bin/python bench/sqlite_follow.py [--hosts 1000] [--rate 200] [--seconds 20]
        [--watches 2] [--via direct|api] [--rounds 3] [--base DIR] [--history-behind 86400]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api import HV, Server, make_token, process_cpu, read_ok
from replicas import thread_cpu
from tests.dashboard.synthetic import seeded_store

from hvfleet.model import Hypervisor
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager

CANDIDATES = "/placement/allocation_candidates?resources=VCPU:1,MEMORY_MB:1024&limit=10"
FIT = "/apis/hvfleet.io/v1/fit"


class Fleet:
    """One server over its own copy of the synthetic fleet, its readers open."""

    def __init__(self, label: str, tmp: Path, hosts: int, watches: int, agents: int,
                 src: str | None, options: dict[str, str], history_behind: int = 0) -> None:
        self.label = label
        tmp.mkdir(parents=True, exist_ok=True)
        self.url = seeded_store(tmp / "fleet.db", hosts)
        self.hosts = hosts
        if history_behind:
            # Each side's own code keeps the history it would have kept (history_writes.seed_into).
            env = {**os.environ, "PYTHONPATH": src} if src is not None else dict(os.environ)
            subprocess.run([sys.executable, str(Path(__file__).with_name("history_writes.py")),
                            "--seed-into", self.url, str(history_behind), str(int(time.time()))],
                           env=env, check=True, capture_output=True, timeout=3600)
        with open_store(self.url) as s:
            self.viewers = [make_token(s, "viewer", name=f"viewer-{k}") for k in range(watches)]
            self.scheduler = make_token(s, "scheduler", name="scheduler")
            self.agents = [make_token(s, "agent", hypervisor=f"hv-{i:05d}") for i in range(agents)]
        saved = os.environ.get("PYTHONPATH")
        if src is not None:
            os.environ["PYTHONPATH"] = src
        try:
            self.server = Server(self.url, tmp / "data", options=options)
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        self.stop = threading.Event()
        self.lines = 0
        self.asked = 0
        self.threads = [threading.Thread(target=self._watch, args=(t,), daemon=True) for t in self.viewers]
        self.threads.append(threading.Thread(target=self._ask, daemon=True))
        for t in self.threads:
            t.start()

    def _watch(self, token: str) -> None:
        conn = self.server.connection(timeout=3600)
        conn.request("GET", f"{HV}?watch=true", headers={"Authorization": f"Bearer {token}"})
        answer = conn.getresponse()
        assert answer.status == 200, answer.status
        while not self.stop.is_set():
            line = answer.readline()
            if not line:
                return
            self.lines += 1

    def _ask(self) -> None:
        conn = self.server.connection()
        auth = {"Authorization": f"Bearer {self.scheduler}", "OpenStack-API-Version": "placement 1.39"}
        body = json.dumps({"cpu": "1", "memory": "1Gi", "limit": 5})
        while not self.stop.wait(ASK_EVERY):
            conn.request("GET", CANDIDATES, headers=auth)
            read_ok(conn, "candidates")
            conn.request("POST", FIT, body=body, headers={**auth, "Content-Type": "application/json"})
            read_ok(conn, "fit")
            self.asked += 1

    def close(self) -> None:
        self.stop.set()
        self.server.stop()


ASK_EVERY = 0.5


def _status(h: Hypervisor, i: int, now: datetime) -> dict[str, object]:
    cpus = int(h.status.capacity[next(r for r in h.status.capacity if str(r) == "cpu")].value)
    return {**h.status.to_dict(), "allocation": {"cpu": str(i % (cpus * 2) + 1), "memory": "8Gi"},
            "lastHeartbeatTime": now.isoformat()}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class DirectWriter:
    """Status writes straight into a fleet's SQLite file, as each host's agent."""

    def __init__(self, fleet: Fleet) -> None:
        self.store = open_store(fleet.url)
        self.last = {h.name: h for h in self.store.list_hypervisors()}
        self.names = sorted(self.last)

    def write(self, i: int, now: datetime) -> None:
        name = self.names[i % len(self.names)]
        h = self.last[name]
        new = h.model_copy(update={"status": h.status.model_validate(_status(h, i, now))})
        done = self.store.update(new, agent_manager(name))
        assert isinstance(done, Hypervisor)
        self.last[name] = done

    def close(self) -> None:
        self.store.close()


class ApiWriter:
    """Status writes through the server, each host's with its agent token."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.conn = fleet.server.connection()
        with open_store(fleet.url) as s:
            self.last = {f"hv-{i:05d}": s.get_hypervisor(f"hv-{i:05d}") for i in range(len(fleet.agents))}

    def write(self, i: int, now: datetime) -> None:
        a = i % len(self.fleet.agents)
        name = f"hv-{a:05d}"
        h = self.last[name]
        body = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
                "metadata": {"name": name, "resourceVersion": h.metadata.resource_version},
                "status": _status(h, i, now)}
        headers = {"Authorization": f"Bearer {self.fleet.agents[a]}", "Content-Type": "application/json"}
        try:
            self.conn.request("PUT", f"{HV}/{name}/status", body=json.dumps(body), headers=headers)
        except OSError:  # the server closed the connection after its keep-alive time (a long idle window)
            self.conn.close()
            self.conn = self.fleet.server.connection()
            self.conn.request("PUT", f"{HV}/{name}/status", body=json.dumps(body), headers=headers)
        self.last[name] = Hypervisor.model_validate_json(read_ok(self.conn, "status write"))

    def close(self) -> None:
        self.conn.close()


def _drive(writers: list[DirectWriter | ApiWriter], rate: float, seconds: float, first: int) -> int:
    """Writes to every fleet in turn, `rate` per second each, for `seconds`."""
    start = time.monotonic()
    i = first
    base = datetime.now(UTC)
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate)
        while i - first < due:
            now = base + timedelta(milliseconds=i)
            for w in writers:
                w.write(i, now)
            i += 1
        time.sleep(0.005)
    return i - first


@contextlib.contextmanager
def _fleets(args: argparse.Namespace, tmp: Path) -> Iterator[list[Fleet]]:
    sides = [("head", None)]
    if args.base:
        sides.insert(0, ("base", str(Path(args.base).resolve() / "src")))
    agents = args.agents if args.via == "api" else 0
    fleets: list[Fleet] = []
    try:
        for label, src in sides:
            options = {"history_tiers": args.history_tiers} if args.history_tiers else {}
            fleets.append(Fleet(label, tmp / label, args.hosts, args.watches, agents, src, options,
                                args.history_behind))
        yield fleets
    finally:
        for f in fleets:
            f.close()


def _seal(src: str | None) -> str:
    """The seal of the model code a server runs (`encoding._FINGERPRINT`)."""
    env = {**os.environ, "PYTHONPATH": src} if src else dict(os.environ)
    return subprocess.run([sys.executable, "-c", "from hvfleet.store import encoding; "
                           "print(encoding._FINGERPRINT)"], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _round(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    with _fleets(args, tmp) as fleets:
        writers: list[DirectWriter | ApiWriter] = [
            DirectWriter(f) if args.via == "direct" else ApiWriter(f) for f in fleets]
        try:
            _drive(writers, args.rate, 2.0, 0)  # warm: the readers' first catch-ups, the caches
            time.sleep(args.settle)
            idle = {f.label: process_cpu(f.server.proc.pid) for f in fleets}
            time.sleep(args.seconds)
            idle = {f.label: (process_cpu(f.server.proc.pid) - idle[f.label]) / args.seconds for f in fleets}
            before = {f.label: process_cpu(f.server.proc.pid) for f in fleets}
            lines = {f.label: f.lines for f in fleets}
            profiler, threads = None, {}
            if args.profile:  # py-spy over the head server's writing window, and its threads' CPU
                head = fleets[-1].server.proc.pid
                profiler = subprocess.Popen(
                    [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(head), "--threads",
                     "--nonblocking", "-d", str(int(args.seconds)), "-r", "200", "-f", "raw",
                     "-o", args.profile], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                threads = thread_cpu(head)
            t0 = time.monotonic()
            n = _drive(writers, args.rate, args.seconds, 10**6)
            time.sleep(1.0)  # the last writes followed
            if profiler is not None:
                profiler.wait()
                after = thread_cpu(fleets[-1].server.proc.pid)
                used = sorted(((after[k] - threads.get(k, 0.0), k) for k in after), reverse=True)
                Path(args.profile).with_suffix(".cpu").write_text(
                    "".join(f"{tid} {sec:.2f}\n" for sec, tid in used if sec > 0))
            window = time.monotonic() - t0
            out: dict[str, float] = {}
            for f in fleets:
                taken_off = 0.0 if args.history_behind else idle[f.label] * window
                used = process_cpu(f.server.proc.pid) - before[f.label] - taken_off
                out[f.label] = used / n * 1000
                print(f"  {f.label}: {n} writes ({n / args.seconds:.0f}/s), {out[f.label]:.3f} ms of "
                      f"server CPU per write (idle {idle[f.label] * 1000:.1f} ms/s"
                      f"{', not taken off' if args.history_behind else ' taken off'}), "
                      f"RSS {_rss_mib(f.server.proc.pid):.0f} MiB, "
                      f"{(f.lines - lines[f.label]) / max(1, n * args.watches):.2f} lines per write "
                      f"per watch, {f.asked} asks", flush=True)
            return out
        finally:
            for w in writers:
                w.close()


def main() -> None:
    global ASK_EVERY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--watches", type=int, default=2)
    ap.add_argument("--ask-every", type=float, default=0.5)
    ap.add_argument("--via", choices=["direct", "api"], default="direct")
    ap.add_argument("--agents", type=int, default=200, help="hosts written with --via api")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--history-tiers", help="the servers' --history-tiers (default: theirs)")
    ap.add_argument("--history-behind", type=int, default=0,
                    help="seconds of history every host has in the store before the server starts "
                         "(its figures changing at every point), as each side's code keeps it")
    ap.add_argument("--base", help="another checkout, measured beside this one")
    ap.add_argument("--profile", help="py-spy samples of the head server's writing window, to this file")
    args = ap.parse_args()
    ASK_EVERY = args.ask_every
    random.seed(1)
    print(f"SQLite server, {args.hosts} hosts, {args.watches} API watches of hypervisors, candidates "
          f"and fit every {args.ask_every} s; status writes {args.via} at {args.rate:.0f}/s for "
          f"{args.seconds:.0f} s; load {os.getloadavg()[0]:.1f}", flush=True)
    if args.base and args.via == "direct" and _seal(str(Path(args.base).resolve() / "src")) != _seal(None):
        # This process writes with this checkout's model code: the base server
        # (other model code) cannot vouch for those values and decodes them all.
        print("warning: the base checkout's model code differs from this one's, so its server "
              "decodes every direct write; compare with --via api", flush=True)
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        print(f"round {r + 1}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(_round(args, Path(tmp)))
    labels = list(rounds[0])
    medians = {label: statistics.median(r[label] for r in rounds) for label in labels}
    print(f"\nserver CPU per followed write, median of {args.rounds} rounds (load "
          f"{os.getloadavg()[0]:.1f}):")
    for label in labels:
        print(f"  {label:5s} {medians[label]:.3f} ms  (rounds: "
              + ", ".join(f"{r[label]:.3f}" for r in rounds) + ")")
    if "base" in medians:
        ratios = [r["head"] / r["base"] for r in rounds]
        print(f"  head / base: {statistics.median(ratios):.2f}x (rounds: "
              + ", ".join(f"{x:.2f}" for x in ratios) + ")")


if __name__ == "__main__":
    main()
