"""Two checkouts' bench figures in the same run: base against head, round by round.

Each checkout runs its own code with its own virtualenv (`<tree>/.venv/bin/python`,
checked to import hvfleet from `<tree>/src`). In every round each bench runs
once per checkout, the order alternating (base first in odd rounds, head first
in even ones), so the load of a shared machine hits both alike; a figure's
ratio is the median over rounds of head/base within the round, and its range
(min–max of those per-round ratios) says how noisy it was.

- scheduling, guests, api: the checkout's own `bench/<name>.py` with small
  settings, its printed figures parsed; plus the user+sys CPU of the whole
  bench process (os.wait4), a figure that the machine's load barely moves.
- replicas, replicas_sqlite: the checkout's `bench/replicas.py` without its
  fleet phase (`--writes`, `--replicas`, `--far-hosts`): server CPU per lease
  renewal (agents pinned to a replica; alternating replicas; with
  `--far-hosts`, a large fleet through any replica), per status write and per
  followed event, over a 3-member etcd / one SQLite file.
- cli_startup: whole-process timings of the same `hvfleet` commands as
  bench/cli_startup.py (each a fresh process, output discarded, on a SQLite
  store of the demo fleet written by that checkout's agent), base and head
  taken in turn command by command: median wall and user+sys CPU of the child.
  `--worker` adds the same commands with that checkout's `hvfleet worker` running.

Figures that neither checkout's code decides (virt-install, libvirt, kubectl,
`python -c pass`) are shown as controls: their ratio is the noise floor.

    .venv/bin/python -m bench.compare --base ../wt-base --head . --rounds 5 \\
        scheduling guests api cli_startup
    .venv/bin/python -m bench.compare --base ../wt-base --head . --rounds 3 replicas replicas_sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

WORSE = 1.10  # a median ratio beyond this, in the bad direction, every round agreeing, is "WORSE"


@dataclass(frozen=True)
class Figure:
    """One parsed figure: its value and unit, whether lower is better, and
    whether the checkout's code decides it (False: a control, e.g. a peer)."""

    value: float
    unit: str
    lower_is_better: bool = True
    control: bool = False


Figures = dict[str, Figure]


@dataclass
class Series:
    unit: str
    lower_is_better: bool
    control: bool
    base: list[float] = field(default_factory=list)
    head: list[float] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [h / b for b, h in zip(self.base, self.head, strict=False) if b > 0]


# -- the checkouts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    label: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / ".venv" / "bin" / "python"

    @property
    def hvfleet(self) -> Path:
        return self.root / ".venv" / "bin" / "hvfleet"

    def check(self) -> None:
        """Refuse a checkout whose virtualenv imports another checkout's hvfleet."""
        if not self.python.exists():
            raise SystemExit(f"--{self.label} {self.root}: no .venv/bin/python (run `make deps` there)")
        out = subprocess.run([str(self.python), "-c", "import hvfleet; print(hvfleet.__file__)"],
                             capture_output=True, text=True, cwd=self.root, env=clean_env(), check=False)
        where = Path(out.stdout.strip()).resolve()
        if out.returncode != 0 or not where.is_relative_to((self.root / "src").resolve()):
            raise SystemExit(f"--{self.label} {self.root}: its python imports hvfleet from "
                             f"{where or out.stderr.strip()[-200:]}, not from {self.root / 'src'}")
        # The editable install leaves hvfleet's modules uncompiled; compile them
        # as pip would for an installed package (both checkouts alike).
        subprocess.run([str(self.python), "-m", "compileall", "-q", "src"], cwd=self.root, check=True,
                       stdout=subprocess.DEVNULL)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without a user's worker or virtualenv in the way."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["HVFLEET_WORKER"] = "0"
    env.update(extra)
    return env


def timed(argv: list[str], cwd: Path, env: dict[str, str],
          stdout: int = subprocess.DEVNULL) -> tuple[float, float, bytes]:
    """(wall seconds, user+sys CPU seconds, stdout) of one run of argv, the CPU
    from the kernel's accounting of that child (and the children it waited for)."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=out if stdout == subprocess.PIPE else stdout, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv)} (in {cwd}) exited {proc.returncode}: "
                             f"{err.read().decode(errors='replace')[-800:]}")
        out.seek(0)
        return wall, usage.ru_utime + usage.ru_stime, out.read()


# -- benches that print their figures --------------------------------------------------------

NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def num(text: str) -> float:
    return float(text.replace(",", ""))


def parse_scheduling(out: str) -> Figures:
    figs: Figures = {}
    row = re.compile(rf"^\s*(\d+)\s+{NUM}s\s+{NUM} ms\s+{NUM} ms\s+{NUM} ms\s+{NUM} ms\s+{NUM} ms",
                     re.M)
    for m in row.finditer(out):
        n = int(m.group(1))
        figs[f"fit index build, {n:,} hosts"] = Figure(num(m.group(2)) * 1000, "ms")
        for col, what in ((4, "fit p50, full list"), (5, "fit p99, full list"),
                          (6, "fit p50, best 10"), (7, "fit p99, best 10")):
            figs[f"{what}, {n:,} hosts"] = Figure(num(m.group(col)), "ms")
    claims = re.compile(rf"^claims, 8 processes on (\w+), (\d+) hosts?: .*= {NUM} claims/s", re.M)
    for m in claims.finditer(out):
        figs[f"claims/s, 8 processes, {m.group(1)}, {m.group(2)} host(s)"] = Figure(
            num(m.group(3)), "/s", lower_is_better=False)
    return figs


GUEST_ROWS = {
    "hvfleet guest generate, guest commands only, cache warm": ("guest generate, process, warm cache", False),
    "the same, cache cold (osinfo-db and cpu_map parsed)": ("guest generate, process, cold cache", False),
    "hvfleet guest generate (console script, every command family)": ("guest generate, console script",
                                                                      False),
    "hvfleet guest generate (console script, hvfleet worker running)": ("guest generate, worker running",
                                                                        False),
    "floor: python -c 'import lxml.etree'": ("control: python -c 'import lxml.etree'", True),
}


def parse_guests(out: str) -> Figures:
    figs: Figures = {}
    if m := re.search(rf"hvfleet generate\(\), in-process, warm:\s+{NUM} ms", out):
        figs["generate(), in process, per guest"] = Figure(num(m.group(1)), "ms")
    if m := re.search(rf"hvfleet one-time load \(osinfo-db, cpu_map, caps\): {NUM} ms", out):
        figs["generate(), one-time load"] = Figure(num(m.group(1)), "ms")
    if m := re.search(rf"virt-install --print-xml --dry-run, per process:\s+{NUM} ms", out):
        figs["control: virt-install --print-xml"] = Figure(num(m.group(1)), "ms", control=True)
    for m in re.finditer(rf"^(.+): \s*{NUM} ms per process", out, re.M):
        name = GUEST_ROWS.get(m.group(1))
        if name:
            figs[name[0]] = Figure(num(m.group(2)), "ms", control=name[1])
    row = re.compile(rf"^\s*(\d+)\s+([\w-]+)\s+{NUM}\s+{NUM}\s+{NUM}x", re.M)
    for m in row.finditer(out):
        n, what = int(m.group(1)), m.group(2)
        figs[f"CPU baseline, {n:,} hosts, {what}"] = Figure(num(m.group(3)), "ms")
        if what != "store":  # the store row's libvirt call repeats same-hw's
            figs[f"control: libvirt baselineCPU, {n:,} hosts, {what}"] = Figure(
                num(m.group(4)), "ms", control=True)
    return figs


def parse_api(out: str) -> Figures:
    figs: Figures = {}
    store = "?"
    for line in out.splitlines():
        if m := re.match(r"\[(\w+)\]", line):
            store = m.group(1)
            continue
        line = line.strip()
        if m := re.match(rf"status writes through the API: {NUM}/s, p50 {NUM} ms, p99 {NUM} ms", line):
            figs[f"{store}: status writes through the API"] = Figure(num(m.group(1)), "/s",
                                                                     lower_is_better=False)
            figs[f"{store}: status write p50"] = Figure(num(m.group(2)), "ms")
            figs[f"{store}: status write p99"] = Figure(num(m.group(3)), "ms")
        elif m := re.match(rf"peer, the same CAS writes into the store directly: {NUM}/s", line):
            figs[f"{store}: peer, direct Store.update"] = Figure(num(m.group(1)), "/s",
                                                                 lower_is_better=False)
        elif m := re.match(rf"watch delivery to \d+ API watchers: p50 {NUM} ms, p99 {NUM} ms", line):
            figs[f"{store}: watch delivery p50"] = Figure(num(m.group(1)), "ms")
            figs[f"{store}: watch delivery p99"] = Figure(num(m.group(2)), "ms")
        elif m := re.match(rf"peer, one direct Store.watch: p50 {NUM} ms", line):
            figs[f"{store}: peer, direct Store.watch p50"] = Figure(num(m.group(1)), "ms")
        elif m := re.match(rf"(.+): median {NUM} ms", line):
            what = m.group(1)
            control = what.startswith("kubectl")
            label = ("control: " if control else "") + re.sub(r" --store .*\((\w+)\)$", r" (\1)", what)
            figs[f"{store}: {label}"] = Figure(num(m.group(2)), "ms", control=control)
    return figs


def parse_replicas(out: str) -> Figures:
    """bench/replicas.py: server CPU per write (process CPU of the replicas)."""
    figs: Figures = {}
    where = "sqlite" if "one SQLite file" in out else "etcd"
    if m := re.search(rf"^direct store \(this process\)\s+{NUM} ms\s+{NUM} ms", out, re.M):
        # The checkout's own store code (EtcdStore, SqliteStore) in the bench process: a peer, not a control.
        figs[f"{where}: peer: direct store, CPU per lease renewal"] = Figure(num(m.group(1)), "ms")
        figs[f"{where}: peer: direct store, CPU per status write"] = Figure(num(m.group(2)), "ms")
    row = re.compile(rf"^(\d+) replica\(s\), sum of all\s+{NUM} ms\s+{NUM} ms\s+(?:{NUM} ms|-)\s+{NUM}$",
                     re.M)
    for m in row.finditer(out):
        n = m.group(1)
        figs[f"{where}: {n} replica(s), server CPU per lease renewal"] = Figure(num(m.group(2)), "ms")
        figs[f"{where}: {n} replica(s), server CPU per status write"] = Figure(num(m.group(3)), "ms")
        if m.group(4):
            figs[f"{where}: {n} replicas, CPU per followed event"] = Figure(num(m.group(4)), "ms")
        figs[f"{where}: {n} replica(s), status writes/s"] = Figure(num(m.group(5)), "/s",
                                                                  lower_is_better=False)
    for m in re.finditer(rf"^(\d+) replicas, followed event, writes made in the store at (\d+)/s "
                         rf"\(reached \d+/s\), each replica \(median\): {NUM} ms$", out, re.M):
        figs[f"{where}: {m.group(1)} replicas, CPU per followed event at {m.group(2)} writes/s"] = Figure(
            num(m.group(3)), "ms")
    for m in re.finditer(rf"^(\d+) replicas, lease renewal alternating replicas, sum of all: {NUM} ms$",
                         out, re.M):
        figs[f"{where}: {m.group(1)} replicas, server CPU per lease renewal, alternating replicas"] = Figure(
            num(m.group(2)), "ms")
    for m in re.finditer(rf"^(\d+) replicas, lease renewal in a fleet of (\d+) through any replica, "
                         rf"sum of all: {NUM} ms$", out, re.M):
        figs[f"{where}: {m.group(1)} replicas, server CPU per lease renewal, fleet of {m.group(2)}"] = Figure(
            num(m.group(3)), "ms")
    return figs


@dataclass(frozen=True)
class ScriptBench:
    """A bench script run whole: its argv after `bench/<name>.py` and its parser."""

    name: str
    args: tuple[str, ...]
    parse: Callable[[str], Figures]

    def run(self, tree: Tree, tmp: Path, log: Path | None = None) -> Figures:
        env = clean_env(TMPDIR=str(tmp))
        _, cpu, out = timed([str(tree.python), f"bench/{self.name}.py", *self.args], tree.root, env,
                            stdout=subprocess.PIPE)
        if log is not None:
            log.write_bytes(out)
        figs = self.parse(out.decode())
        if not figs:
            raise SystemExit(f"bench/{self.name}.py in {tree.root} printed no figure I can read:\n"
                             f"{out.decode()[-1500:]}")
        figs[f"whole bench process, user+sys CPU ({' '.join(self.args)})"] = Figure(cpu, "s")
        return figs


# -- cli_startup: whole processes, command by command ----------------------------------------

CLI_COMMANDS: dict[str, list[str]] = {
    "hvfleet --help": ["--help"],
    "hvfleet get hypervisors": ["get", "hypervisors"],
    "hvfleet capacity": ["capacity"],
    # A round on a loaded machine may outlast the heartbeats' 180 s staleness.
    "hvfleet fit --cpu 2 --memory 4Gi": ["fit", "--cpu", "2", "--memory", "4Gi", "--staleness", "1h"],
    "hvfleet guest policies": ["guest", "policies"],
}


class CliStartup:
    """Each checkout's `hvfleet` commands on its own SQLite store of the demo fleet."""

    name = "cli_startup"

    def __init__(self, trees: list[Tree], tmp: Path, worker: bool) -> None:
        self.worker = worker
        self.env: dict[str, dict[str, str]] = {}
        self.warm: dict[str, dict[str, str]] = {}
        for tree in trees:
            home = tmp / f"cli-{tree.label}"
            home.mkdir()
            # Bytecode cached in a private prefix, as for an installed package.
            env = clean_env(HVFLEET_STORE=f"sqlite:///{home}/hvfleet.db",
                            PYTHONPYCACHEPREFIX=str(home / "pycache"))
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            self.env[tree.label] = env
            self.refresh(tree)
            if worker:
                warm = {k: v for k, v in env.items() if k != "HVFLEET_WORKER"}
                warm["XDG_RUNTIME_DIR"] = str(home / "run")
                self.warm[tree.label] = warm

    def refresh(self, tree: Tree) -> None:
        """One `hvfleet agent --once` per demo host: every host Ready (fresh
        heartbeats, as `fit` wants them), by that checkout's own agent."""
        for node in sorted((tree.root / "examples" / "fleet").glob("*.xml")):
            timed([str(tree.hvfleet), "agent", "--connect", f"test://{node}", "--once"], tree.root,
                  self.env[tree.label])

    @contextmanager
    def workers(self, trees: list[Tree]) -> Iterator[None]:
        started: list[Tree] = []
        try:
            for tree in trees if self.worker else []:
                timed([str(tree.hvfleet), "worker", "start"], tree.root, self.warm[tree.label])
                started.append(tree)
            yield
        finally:
            for tree in started:
                subprocess.run([str(tree.hvfleet), "worker", "stop"], cwd=tree.root,
                               env=self.warm[tree.label], check=False, capture_output=True)

    def warm_up(self, trees: list[Tree]) -> None:
        """One uncounted run of every command: bytecode written, page cache warm."""
        for tree in trees:
            for _, argv, env, _ in self.commands(tree):
                timed(argv, tree.root, env)

    def commands(self, tree: Tree) -> list[tuple[str, list[str], dict[str, str], bool]]:
        env = self.env[tree.label]
        out = [(name, [str(tree.hvfleet), *argv], env, False) for name, argv in CLI_COMMANDS.items()]
        if self.worker:
            out += [(f"{name} (worker)", [str(tree.hvfleet), *argv], self.warm[tree.label], False)
                    for name, argv in CLI_COMMANDS.items()]
        out.append(("python -c pass", [str(tree.python), "-c", "pass"], env, True))
        if shutil.which("virsh"):
            out.append(("virsh -c test:///default list", ["virsh", "-c", "test:///default", "list"], env,
                        True))
        return out

    def round(self, order: list[Tree], runs: int) -> dict[str, Figures]:
        """`runs` runs of every command, base and head in turn for each; the
        medians of this round, wall and CPU."""
        walls: dict[tuple[str, str], list[float]] = {}
        cpus: dict[tuple[str, str], list[float]] = {}
        controls: set[str] = set()
        for tree in order:  # untimed; a loaded machine's round outlasts a heartbeat's staleness
            self.refresh(tree)
        per_tree = {t.label: self.commands(t) for t in order}
        for _ in range(runs):
            for i in range(len(per_tree[order[0].label])):
                for tree in order:
                    name, argv, env, control = per_tree[tree.label][i]
                    wall, cpu, _ = timed(argv, tree.root, env)
                    walls.setdefault((tree.label, name), []).append(wall * 1000)
                    cpus.setdefault((tree.label, name), []).append(cpu * 1000)
                    if control:
                        controls.add(name)
        figs: dict[str, Figures] = {t.label: {} for t in order}
        for (label, name), values in walls.items():
            prefix = "control: " if name in controls else ""
            figs[label][f"{prefix}{name}, wall"] = Figure(statistics.median(values), "ms",
                                                          control=name in controls)
            figs[label][f"{prefix}{name}, cpu"] = Figure(statistics.median(cpus[(label, name)]), "ms",
                                                         control=name in controls)
        return figs


# -- the comparison --------------------------------------------------------------------------


def script_benches(args: argparse.Namespace) -> dict[str, ScriptBench]:
    sizes = args.fit_sizes
    far = ("--far-hosts", str(args.far_hosts)) if args.far_hosts else ()
    return {
        "scheduling": ScriptBench("scheduling", ("--sizes", sizes, "--placement-sizes", "",
                                                 "--queries", "200", "--claims", str(args.claims)),
                                  parse_scheduling),
        "guests": ScriptBench("guests", ("--quick",), parse_guests),
        "api": ScriptBench("api", ("--quick", *(() if args.etcd else ("--no-etcd",))), parse_api),
        # Server CPU per write over a 3-member etcd, and over one SQLite file.
        "replicas": ScriptBench("replicas", ("--hosts", "40", "--writes", str(args.writes),
                                             "--fleet-hosts", "0", "--replicas", args.replicas,
                                             *far),
                                parse_replicas),
        "replicas_sqlite": ScriptBench("replicas", ("--hosts", "40", "--writes", str(args.writes),
                                                    "--fleet-hosts", "0", "--replicas", "1",
                                                    "--store", "sqlite"), parse_replicas),
    }


def record(results: dict[str, Series], label: str, figs: Figures) -> None:
    for name, fig in figs.items():
        s = results.setdefault(name, Series(fig.unit, fig.lower_is_better, fig.control))
        (s.base if label == "base" else s.head).append(fig.value)


def verdict(s: Series) -> str:
    rs = s.ratios()
    if not rs or s.control:
        return "control" if s.control else ""
    # In "lower is better" terms: a figure is worse when its median ratio is
    # beyond WORSE and every round agrees on the direction; else it is noise.
    r, lo, hi = (statistics.median(rs), min(rs), max(rs)) if s.lower_is_better else (
        1 / statistics.median(rs), 1 / max(rs), 1 / min(rs))
    if r > WORSE:
        return "WORSE" if lo > 1 else "noisy"
    if r < 1 / WORSE:
        return "better" if hi < 1 else "noisy"
    return "same"


def show(results: dict[str, Series], order: list[str], title: str, console: Console) -> None:
    table = Table(title=title)
    for col, justify in (("figure", "left"), ("base", "right"), ("head", "right"),
                         ("ratio head/base", "right"), ("range of rounds", "right"), ("", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for bench in order:
        for name, s in results.items():
            if not name.startswith(f"{bench} | "):
                continue
            rs = s.ratios()
            if not rs:
                continue
            what = name.split(" | ", 1)[1] + ("" if s.lower_is_better else " (higher is better)")
            table.add_row(f"{bench}: {what}", fmt(statistics.median(s.base), s.unit),
                          fmt(statistics.median(s.head), s.unit), f"{statistics.median(rs):.2f}",
                          f"{min(rs):.2f}–{max(rs):.2f}", verdict(s))
    console.print(table)


def fmt(value: float, unit: str) -> str:
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "s":
        return f"{value:,.1f} s"
    return f"{value:,.1f} ms" if value >= 10 else f"{value:.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("benches", nargs="*", default=["scheduling", "guests", "api", "cli_startup"],
                    help="scheduling, guests, api, cli_startup, replicas, replicas_sqlite "
                         "(default: the first four)")
    ap.add_argument("--base", type=Path, required=True, help="the checkout measured as before")
    ap.add_argument("--head", type=Path, default=Path("."), help="the checkout measured as after")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cli-runs", type=int, default=5, help="runs of each command per round (median)")
    ap.add_argument("--worker", action="store_true", help="cli_startup: also with `hvfleet worker` running")
    ap.add_argument("--fit-sizes", default="1000,10000,100000", help="scheduling: fleet sizes")
    ap.add_argument("--claims", type=int, default=100, help="scheduling: claims per process")
    ap.add_argument("--etcd", action="store_true", help="api: also over a one-member etcd")
    ap.add_argument("--writes", type=int, default=1000, help="replicas: writes per measured phase")
    ap.add_argument("--replicas", default="1,2,3", help="replicas: the replica counts")
    ap.add_argument("--far-hosts", type=int, default=0,
                    help="replicas: also renew the Leases of a fleet of this many agents through any "
                         "replica (bench/replicas.py --far-hosts; the base checkout's bench must have it)")
    ap.add_argument("--save", type=Path, help="write every round's figures as JSON")
    ap.add_argument("--log", type=Path, help="a directory for what each bench run printed")
    args = ap.parse_args()
    known = {"scheduling", "guests", "api", "cli_startup", "replicas", "replicas_sqlite"}
    if bad := [b for b in args.benches if b not in known]:
        ap.error(f"unknown bench {', '.join(bad)} (known: {', '.join(sorted(known))})")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    base, head = Tree("base", args.base.resolve()), Tree("head", args.head.resolve())
    if args.log:
        args.log.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    for tree in (base, head):
        tree.check()
    load = os.getloadavg()[0]
    results: dict[str, Series] = {}
    scripts = script_benches(args)
    with tempfile.TemporaryDirectory(prefix="hvfleet-compare-") as tmp_dir:
        tmp = Path(tmp_dir)
        cli = CliStartup([base, head], tmp, args.worker) if "cli_startup" in args.benches else None
        with cli.workers([base, head]) if cli else nullcontext():
            if cli:
                cli.warm_up([base, head])
            for r in range(args.rounds):
                order = [base, head] if r % 2 == 0 else [head, base]
                for bench in args.benches:
                    console.log(f"round {r + 1}/{args.rounds}: {bench} "
                                f"({' then '.join(t.label for t in order)}), load {os.getloadavg()[0]:.1f}")
                    if bench == "cli_startup":
                        assert cli is not None
                        for label, figs in cli.round(order, args.cli_runs).items():
                            record(results, label, {f"{bench} | {k}": v for k, v in figs.items()})
                        continue
                    for tree in order:
                        log = args.log / f"{bench}-{tree.label}-{r + 1}.txt" if args.log else None
                        figs = scripts[bench].run(tree, tmp, log)
                        record(results, tree.label, {f"{bench} | {k}": v for k, v in figs.items()})
                if r + 1 < args.rounds:  # what the rounds so far say, in case the run is cut short
                    report(results, args, base, head, load, r + 1, console)
    report(results, args, base, head, load, args.rounds, Console(width=200))


def report(results: dict[str, Series], args: argparse.Namespace, base: Tree, head: Tree, load: float,
           rounds: int, console: Console) -> None:
    loads = f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} now"
    title = (f"base {base.root} ({git_head(base)}) vs head {head.root} ({git_head(head)}), "
             f"{rounds} of {args.rounds} rounds, {loads}")
    show(results, args.benches, title, console)
    if args.save:
        args.save.write_text(json.dumps({"title": title, "figures": {
            k: {"unit": s.unit, "lower_is_better": s.lower_is_better, "control": s.control,
                "base": s.base, "head": s.head} for k, s in results.items()}}, indent=1))


def git_head(tree: Tree) -> str:
    out = subprocess.run(["git", "-C", str(tree.root), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
