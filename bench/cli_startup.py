"""CLI start-up: whole-process wall time of `hvfleet` commands, each next to
`virsh` and `kubectl` measured in the same run.

Every command runs as a fresh process (`subprocess.run`, output discarded)
after one warm-up, interleaved round by round so machine drift hits all
commands alike; the figure is the median wall time, with min and max, and
user+sys CPU from the children's rusage. The store is a SQLite file holding
the demo fleet (examples/fleet, one `hvfleet agent --once` per host), so
`get`, `capacity` and `fit` read seven real hypervisors. Bytecode is cached
(in a temporary prefix) as for an installed package. Each `hvfleet` command
is measured as its own process (HVFLEET_WORKER=0) and, marked "(worker)",
with `hvfleet worker` running (worker/launch.py hands it to the warm worker).

    .venv/bin/python bench/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleet"
AIM_MS = 300.0


def hvfleet() -> list[str]:
    exe = shutil.which("hvfleet", path=os.path.dirname(sys.executable)) or shutil.which("hvfleet")
    return [exe] if exe else [sys.executable, "-m", "hvfleet"]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, user+sys CPU seconds) of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.decode()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="hvfleet-startup-"))
    url = f"sqlite:///{tmp}/hvfleet.db"
    # Bytecode caches as an installed package has them (pip compiles at install):
    # in a private prefix, written by the warm-up, even where the environment
    # says not to write bytecode (which would recompile hvfleet's ~80 modules
    # on every start).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(HVFLEET_STORE=url, PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
    env.pop("HVFLEET_WORKER", None)
    warm = {**env, "XDG_RUNTIME_DIR": str(tmp / "run")}
    env["HVFLEET_WORKER"] = "0"
    cli = hvfleet()
    for node in sorted(FLEET.glob("*.xml")):
        subprocess.run([*cli, "agent", "--connect", f"test://{node}", "--once"], env=env, check=True,
                       stdout=subprocess.DEVNULL)

    ours: dict[str, list[str]] = {
        "hvfleet --help": [*cli, "--help"],
        "hvfleet get hypervisors": [*cli, "get", "hypervisors"],
        "hvfleet capacity": [*cli, "capacity"],
        "hvfleet fit --cpu 2 --memory 4Gi": [*cli, "fit", "--cpu", "2", "--memory", "4Gi"],
        "hvfleet guest policies": [*cli, "guest", "policies"],
    }
    commands: dict[str, tuple[list[str], dict[str, str]]] = {k: (v, env) for k, v in ours.items()}
    commands |= {f"{k} (worker)": (v, warm) for k, v in ours.items()}
    commands["python -c pass (interpreter floor)"] = ([sys.executable, "-c", "pass"], env)
    for peer, argv in (("virsh -c test:///default list", ["virsh", "-c", "test:///default", "list"]),
                       ("kubectl version --client", ["kubectl", "version", "--client"])):
        if shutil.which(argv[0]):
            commands[peer] = (argv, env)
        else:
            print(f"peer {argv[0]} not found; install it to compare", file=sys.stderr)

    subprocess.run([*cli, "worker", "start"], env=warm, check=True, stdout=subprocess.DEVNULL)
    walls: dict[str, list[float]] = {k: [] for k in commands}
    cpus: dict[str, list[float]] = {k: [] for k in commands}
    for argv, e in commands.values():
        timed(argv, e)  # warm-up: page cache, .pyc files
    for _ in range(args.runs):
        for name, (argv, e) in commands.items():
            wall, cpu = timed(argv, e)
            walls[name].append(wall)
            cpus[name].append(cpu)
    subprocess.run([*cli, "worker", "stop"], env=warm, check=True, stdout=subprocess.DEVNULL)

    print(f"{args.runs} runs each, interleaved, after one warm-up; store {url} (7 hosts)")
    print(f"{'command':49} {'median':>9} {'min':>9} {'max':>9} {'cpu':>9}  aim < {AIM_MS:.0f} ms")
    peer = "kubectl version --client"
    kubectl = statistics.median(walls[peer]) if peer in walls else None
    for name in commands:
        med = statistics.median(walls[name]) * 1000
        mark = ""
        if name.startswith("hvfleet") and not name.startswith("hvfleet guest policies"):
            mark = "met" if med < AIM_MS else "MISSED"
        ratio = f"  {med / (kubectl * 1000):.2f}× kubectl" if kubectl else ""
        print(f"{name:49} {med:7.1f}ms {min(walls[name]) * 1000:7.1f}ms {max(walls[name]) * 1000:7.1f}ms "
              f"{statistics.median(cpus[name]) * 1000:7.1f}ms  {mark}{ratio}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
