"""The cost of the operations layer: a fit answered the way an edge answers it
(request parsed from its plain dict, the fit, the answer document with exact
quantities; the table for the CLI) next to the bare `FleetIndex.fit` it
wraps, in the same run, on fleets of 1k and 10k hosts (bench/scheduling.py's
fleets and requests).

Run it on two trees to compare before and after a change of the edges: on a
tree without `hvfleet.ops` it measures the API's own code of the time
(`server.actions.fit_request` / `fit_document`).

    .venv/bin/python bench/ops.py [--sizes 1000,10000] [--queries 200]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hvfleet.scheduling.index import FleetIndex
from scheduling import fleet, pct


def plain_requests(k: int, limit: int | None, seed: int = 2) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"resources": {"cpu": str(rng.choice([1, 2, 4, 8, 16, 32])),
                           "memory": f"{rng.choice([2, 4, 8, 16, 32, 64, 128])}Gi"},
             "limit": limit, "why": False}
            for _ in range(k)]


def edge_answer() -> tuple[str, Callable[[FleetIndex, dict[str, Any]], Any]]:
    try:
        from hvfleet.ops.fit import FitQuery, fit
    except ImportError:
        from hvfleet.server.actions import FitBody, fit_document, fit_request  # type: ignore[attr-defined]

        def before(index: FleetIndex, plain: dict[str, Any]) -> Any:
            body = FitBody.model_validate(plain)
            result = index.fit(fit_request(body), limit=body.limit, why=body.why)
            return fit_document(index, result, body.why)

        return "edge code of the time (actions.fit_request + fit_document)", before

    def after(index: FleetIndex, plain: dict[str, Any]) -> Any:
        return fit(index, FitQuery.from_plain(plain)).document()

    return "ops (FitQuery.from_plain + ops.fit.fit + document)", after


def core(index: FleetIndex, plain: dict[str, Any]) -> Any:
    from hvfleet.scheduling.request import parse_request

    r = plain["resources"]
    return index.fit(parse_request(r["cpu"], r["memory"]), limit=plain["limit"])


def timed(run: Callable[[FleetIndex, dict[str, Any]], Any], index: FleetIndex,
          reqs: list[dict[str, Any]]) -> list[float]:
    out = []
    for plain in reqs:
        t0 = time.perf_counter()
        run(index, plain)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    name, edge = edge_answer()
    print(f"edge: {name}")
    for n in (int(s) for s in args.sizes.split(",")):
        index = FleetIndex()
        index.load(fleet(n), [])
        for limit in (10, None):
            reqs = plain_requests(args.queries if limit else max(args.queries // 10, 5), limit)
            for _ in range(2):  # interleaved, so both see the same machine
                c = timed(core, index, reqs)
                e = timed(edge, index, reqs)
            what = f"{n:>6} hosts, {'best 10' if limit else 'all fitting':<11}"
            for label, values in (("FleetIndex.fit (core)", c), ("edge answer", e)):
                print(f"{what} {label:<22} p50 {pct(values, 50) * 1000:9.3f} ms   "
                      f"p99 {pct(values, 99) * 1000:9.3f} ms")
            print(f"{what} edge / core p50: {pct(e, 50) / pct(c, 50):.2f}x")


if __name__ == "__main__":
    main()
