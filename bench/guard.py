"""What the server's guard costs a request, beside the same request without it.

The app is the real one (`create_app`, the API alone) over SQLite, with a
real token (TokenAuthenticator, record cached) and the RoleAuthorizer. Each
request is one ASGI call made in-process (no socket, no TLS), so a figure is
the app's own time per request. The peer is the same app without the guard's
middleware (`hvfleet.server.guard.Guard`), called in the same run, for
requests that raise nothing (without the guard an error has no answer).

1. The guard's own layer: `Guard` around an ASGI app that answers at once;
   peer: that app alone.
2. GET /version (no token): the cheapest route.
3. GET /apis/hvfleet.io/v1/hypervisors/hv1: authenticated, authorized, one store read.
4. GET of a hypervisor that does not exist: raised NotFound, answered by the
   guard (404 Status); its peer is 3 with the guard, the found object.

    .venv/bin/python bench/guard.py [--n 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.meta import ObjectMeta
from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.server.guard import Guard
from hvfleet.store import open_store
from hvfleet.store.tokens import issue_token

HV = "/apis/hvfleet.io/v1/hypervisors"


async def call(app: ASGIApp, path: str, headers: list[tuple[bytes, bytes]]) -> int:
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "https", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 443),
    }
    code = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal code
        if message["type"] == "http.response.start":
            code = message["status"]

    await app(scope, receive, send)
    return code


async def bare(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI app that answers at once: what the guard's own layer is measured around."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def per_request_us(cases: list[tuple[ASGIApp, str, int]], headers: list[tuple[bytes, bytes]],
                         n: int, rounds: int = 7) -> list[float]:
    """Per case (app, path, expected status): the median over `rounds` of the
    mean microseconds per request of `n` requests. The cases take turns
    within each round, so a busy machine slows them alike."""
    for app, path, want in cases:
        assert await call(app, path, headers) == want, path
    results: list[list[float]] = [[] for _ in cases]
    for r in range(rounds + 1):
        for i, (app, path, _) in enumerate(cases):
            start = time.perf_counter()
            for _ in range(n):
                await call(app, path, headers)
            if r:  # the first round warms up (thread pool, caches)
                results[i].append((time.perf_counter() - start) / n * 1e6)
    return [statistics.median(r) for r in results]


def row(what: str, us: float, peer: str, peer_us: float) -> None:
    print(f"  {what:<40} {us:9.1f} µs   {peer:<40} {peer_us:9.1f} µs   ratio {us / peer_us:5.2f}")


async def measure(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_store(f"sqlite:///{tmp}/bench.db") as store:
        store.create(Hypervisor(metadata=ObjectMeta(name="hv1")), "bench")
        _, text = issue_token(store, "viewer", manager="bench", now=datetime.now(UTC), ttl=None)
        headers = [(b"authorization", f"Bearer {text}".encode())]
        apps = []
        for guarded in (True, False):
            app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
            if not guarded:
                app.user_middleware = [m for m in app.user_middleware if m.cls is not Guard]
            apps.append(app)
        with_guard, without = apps
        print("in-process ASGI requests, SQLite:")
        guard_us, bare_us = await per_request_us([(Guard(bare), "/", 200), (bare, "/", 200)], [], n * 10)
        row("Guard around an immediate answer", guard_us, "the immediate answer alone", bare_us)
        guard_us, bare_us = await per_request_us([(with_guard, "/version", 200), (without, "/version", 200)],
                                                 [], n)
        row("GET /version, guard", guard_us, "GET /version, no guard", bare_us)
        found, bare_us, missing = await per_request_us(
            [(with_guard, f"{HV}/hv1", 200), (without, f"{HV}/hv1", 200), (with_guard, f"{HV}/nope", 404)],
            headers, n)
        row("GET hypervisors/hv1, guard", found, "GET hypervisors/hv1, no guard", bare_us)
        row("GET hypervisors/nope (404 by the guard)", missing, "GET hypervisors/hv1, guard", found)
        for app in apps:
            app.state.ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000)
    args = parser.parse_args()
    asyncio.run(measure(args.n))


if __name__ == "__main__":
    main()
