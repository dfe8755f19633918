"""The CPU the server's app spends on one warm `GET /allocation_candidates`
(1,000 providers, SQLite), with no socket: the ASGI app `hvfleet serve` runs
(`create_app`: Starlette's routing and middleware, the guard, the Placement
edge, the token and role checks, the snapshot, the kept body) driven with
ASGI messages on uvloop, in this process. What is left over the network is
uvicorn's and the kernel's (bench/floor_server.py measures that part).

Run it with each checkout's own interpreter, in turns, to compare two
checkouts (the process's CPU: every thread's, the worker threads' included):

    for i in 1 2 3 4 5; do
        .venv/bin/python bench/placement_edge.py
        ../base/.venv/bin/python ../base/bench/placement_edge.py
    done
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api import make_token
from placement_api import CANDIDATES, VERSION, seed_hvfleet

from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.store import open_store

BATCH = 100


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--providers", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-placement-edge-"))
    store = open_store(f"sqlite:///{work}/hvfleet.db")
    seed_hvfleet(store, args.providers, 0)
    token = make_token(store, "admin", name="bench-admin")
    app = create_app(store, TokenAuthenticator(store, follow=True), RoleAuthorizer(), dashboard_pages=False)
    path, _, query = f"/placement{CANDIDATES}".partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
             "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
             "headers": [(b"host", b"127.0.0.1"), (b"x-auth-token", token.encode()),
                         (b"openstack-api-version", VERSION.encode()), (b"accept", b"application/json")]}

    async def one() -> None:
        sent: list[Any] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            sent.append(message)

        await app(dict(scope), receive, send)
        assert sent[0]["status"] == 200, sent

    async def measure() -> tuple[list[float], list[float]]:
        for _ in range(3):  # the snapshot's load, the index, the kept body
            await one()
        cpu, batches = [], []
        for _ in range(args.requests // BATCH):
            b = time.process_time()
            for _ in range(BATCH):
                c = time.process_time()
                await one()
                cpu.append(time.process_time() - c)
            batches.append((time.process_time() - b) / BATCH)
        return cpu, batches

    cpu, batches = uvloop.run(measure())
    # The clock's ticks make single requests coarse; batches of BATCH are not,
    # and their least is the one the machine's other work disturbed least.
    print(f"warm candidates at {args.providers} providers, app only, {len(cpu)} requests: "
          f"CPU p50 {statistics.median(cpu) * 1e6:.0f} us, mean {statistics.mean(cpu) * 1e6:.0f} us, "
          f"batches of {BATCH}: median {statistics.median(batches) * 1e6:.0f} us, "
          f"least {min(batches) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
