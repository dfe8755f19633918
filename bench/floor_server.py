"""The floor under hvfleet's Placement answers in bench/placement_api.py: a
bare ASGI app on the HTTP stack `hvfleet serve` runs (uvicorn, httptools,
uvloop; plain HTTP on loopback) that answers every GET with fixed bytes read
at start: no routing, token, policy, store or snapshot. A query for more than
any provider has (`VCPU:100000`) gets the empty answer; anything else, the
body in FILE (the candidates answer hvfleet gave). Prints its URL, then serves
until stopped.

    .venv/bin/python bench/floor_server.py FILE
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn

EMPTY = b'{"allocation_requests": [], "provider_summaries": {}}'


def app_for(body: bytes) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        out = EMPTY if b"VCPU:100000" in scope["query_string"] else body
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})
    return app


def main() -> None:
    body = Path(sys.argv[1]).read_bytes()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app_for(body), http="httptools", loop="uvloop", log_level="error",
                            lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
