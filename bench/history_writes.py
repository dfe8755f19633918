"""What one point of the dashboard's history costs the replica that keeps it,
once a series has a day behind it: per host series at 1 min for a day (the
default tiers' `1m:1d`), the CPU of `history.write_point` appending the next
point, and of reading the series back as a host page's "day" chart does.

Each side runs in its own process over its own SQLite file, seeded with
`--series` series of `--points` points each and up to 59 more (so that
the write lands at every fill of a series' own object; what the server would have
kept: `history.stored_series` where the code has it, else the whole series
in one object, as it was kept before): this checkout, and with `--base DIR`
another checkout's `src` in the same rounds, interleaved, so the machine's
load hits both alike. Figures are medians over the series and the rounds.

    .venv/bin/python bench/history_writes.py [--series 200] [--points 1440] [--rounds 3] [--base DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def kept_objects(series: str, tier: Any, points: list[Any]) -> list[Any]:
    """The objects the running code keeps for `points` of a series: its
    `history.stored_series` (the series' object and its parts), or, in code
    from before parts, the whole series in one object."""
    from hvfleet.model.dashboard import HistorySeries, HistorySeriesSpec
    from hvfleet.model.meta import ObjectMeta
    from hvfleet.server.dashboard import history

    stored = getattr(history, "stored_series", None)
    if stored is not None:
        return list(stored(series, tier, points))
    meta = ObjectMeta(name=history.object_name(series, tier.name))
    spec = HistorySeriesSpec(series=series, tier=tier.name, points=points)
    return [HistorySeries(metadata=meta, spec=spec)]


def worker(series_count: int, points: int, step: int) -> dict[str, float]:
    from hvfleet.model.dashboard import HistoryPoint
    from hvfleet.server.dashboard import history
    from hvfleet.store import open_store

    tier = history.Tier("1m", step, 86_400)
    start = 1_000_000_000
    with tempfile.TemporaryDirectory() as tmp, open_store(f"sqlite:///{tmp}/h.db") as store:
        names = [history.host_series(f"hv{i:05d}") for i in range(series_count)]
        for i, name in enumerate(names):
            # Series of a few more points each, so that the write lands at every fill of the
            # series' own object (and now and then moves its points to a part).
            kept = [HistoryPoint(t=start - k * step, v={"cpu": [str((k + i) % 7), "0", "32"],
                                                       "memory": [f"{(k + i) % 5 + 1}Gi", "0", "256Gi"]})
                    for k in range(points + i % 60, 0, -1)]
            for obj in kept_objects(name, tier, kept):
                store.create(obj, history.MANAGER)
        writes, reads = [], []
        now = start + step
        for name in names:
            point = HistoryPoint(t=now, v={"cpu": ["31", "0", "32"], "memory": ["9Gi", "0", "256Gi"]})
            t = time.process_time()
            assert history.write_point(store, name, tier, point)
            writes.append(time.process_time() - t)
        for name in names:
            t = time.process_time()
            if "since" in history.read_points.__code__.co_varnames:
                got = history.read_points(store, name, tier, since=now - 86_400)
            else:
                got = history.read_points(store, name, tier)
            reads.append(time.process_time() - t)
            assert got[-1].v["cpu"][0] == "31"
        return {"write_ms": statistics.median(writes) * 1e3, "read_ms": statistics.median(reads) * 1e3,
                "objects": len(store.list(history.KIND).items)}


def seed_into(url: str, behind: int, now: int) -> int:
    """Give every host of the store at `url` a history of `behind` seconds in
    each of the server's default tiers, its figures changing at every point
    (a host that churned all along), as this process's hvfleet would have kept
    it; returns the objects written. For bench/sqlite_follow.py
    `--history-behind`, run with each side's own code."""
    from hvfleet.model.dashboard import HistoryPoint
    from hvfleet.server.dashboard import history
    from hvfleet.store import open_store

    written = 0
    with open_store(url) as store:
        hosts = [h.name for h in store.list_hypervisors()]
        for tier in history.HistorySettings.parse().tiers:
            span = min(behind, tier.window)
            first = (now - span) // tier.step * tier.step
            times = range(first, now // tier.step * tier.step, tier.step)
            for i, host in enumerate(hosts):
                name = history.host_series(host)
                kept = [HistoryPoint(t=t, v={"cpu": [str((k + i) % 7), "0", "64"],
                                             "memory": [f"{(k + i) % 5 + 1}Gi", "0", "256Gi"]})
                        for k, t in enumerate(times)]
                objects = kept_objects(name, tier, kept)
                for obj in objects:
                    store.create(obj, history.MANAGER)
                written += len(objects)
    return written


def run_side(src: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, __file__, "--worker", "--series", str(args.series),
                          "--points", str(args.points)], env=env, capture_output=True, text=True,
                         check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=200)
    p.add_argument("--points", type=int, default=1440)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--base", type=Path, help="another checkout, measured in the same rounds")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed-into", help=argparse.SUPPRESS)  # STORE_URL BEHIND NOW: see seed_into
    args, rest = p.parse_known_args()
    if args.seed_into:
        print(seed_into(args.seed_into, int(rest[0]), int(rest[1])))
        return
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.worker:
        print(json.dumps(worker(args.series, args.points, 60)))
        return
    sides = {"this checkout": ROOT / "src"}
    if args.base is not None:
        sides["base"] = args.base.resolve() / "src"
    got: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    print(f"history: {args.series} host series of {args.points} points at 1 min (1m:1d), SQLite, "
          f"{args.rounds} rounds")
    for _ in range(args.rounds):
        for name, src in sides.items():
            got[name].append(run_side(src, args))
    for name, runs in got.items():
        print(f"  {name:14} one point's write {statistics.median(r['write_ms'] for r in runs):7.2f} ms CPU   "
              f"a day's read {statistics.median(r['read_ms'] for r in runs):7.2f} ms CPU   "
              f"objects stored {int(runs[0]['objects'])}")
    if "base" in got:
        for key, what in (("write_ms", "write"), ("read_ms", "read")):
            ratios = [a[key] / b[key] for a, b in zip(got["this checkout"], got["base"], strict=True)]
            print(f"  this / base, {what}: {statistics.median(ratios):.3f}x "
                  f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
