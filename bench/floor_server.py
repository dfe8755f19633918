"""The floor under hvfleet's Placement answers in bench/placement_api.py: a
bare ASGI app on the HTTP stack `hvfleet serve` runs (uvicorn, httptools,
uvloop; plain HTTP on loopback, or HTTPS with `CERT KEY`) that answers every
GET with fixed bytes read at start: no routing, token, policy, store or
snapshot. A query for more than any provider has (`VCPU:100000`) gets the
empty answer; anything else, the body in FILE (the candidates answer hvfleet
gave), gzip-encoded (level 1, compressed once at start, as hvfleet keeps it)
to a client whose Accept-Encoding names gzip. Prints its URL, then serves
until stopped.

    .venv/bin/python bench/floor_server.py FILE [CERT KEY]
"""

from __future__ import annotations

import gzip
import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn

EMPTY = b'{"allocation_requests": [], "provider_summaries": {}}'


def app_for(body: bytes) -> Any:
    packed = gzip.compress(body, compresslevel=1, mtime=0)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"application/json")]
        out = body
        if b"VCPU:100000" in scope["query_string"]:
            out = EMPTY
        elif any(k == b"accept-encoding" and b"gzip" in v for k, v in scope["headers"]):
            out = packed
            headers.append((b"content-encoding", b"gzip"))
        headers.append((b"content-length", str(len(out)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})
    return app


def main() -> None:
    body = Path(sys.argv[1]).read_bytes()
    tls = sys.argv[2:4]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    print(f"http{'s' if tls else ''}://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app_for(body), http="httptools", loop="uvloop", log_level="error",
                            lifespan="off", ssl_certfile=tls[0] if tls else None,
                            ssl_keyfile=tls[1] if tls else None)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
