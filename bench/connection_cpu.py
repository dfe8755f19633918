"""The CPU `hvfleet serve`'s HTTP protocol (server/connection.py) spends per
request: a bare ASGI app that answers every request with 2 bytes, served by
uvicorn on uvloop with `http_protocol(IMPL)` on plain HTTP over loopback, in
its own process; a client in this process sends keep-alive requests (a GET,
and a POST with a 4 KiB body), one at a time and 16 per write (pipelined).
The figure is the server process's user+sys CPU (/proc/PID/stat) per
request. `--base-src DIR` runs the same server from another checkout's
`src` (PYTHONPATH) in turns with this one, round by round (order
alternating), and prints each figure's median and the head/base ratio's
median and range over the rounds.

`--h11-parse` measures, in this process and without a socket, what h11 alone
spends per request with uvicorn's `h11.Connection` and with the one
server/connection.py uses (`_HeadKeepingConnection`, which keeps each head's
start): 16 requests in one buffer, parsed and answered, process CPU, medians
of `--rounds` interleaved runs.

    .venv/bin/python bench/connection_cpu.py [--impl httptools] [--requests 4000] [--rounds 5] \\
        [--base-src DIR]
    .venv/bin/python bench/connection_cpu.py --h11-parse [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
BODY = b"x" * 4096
PIPELINE = 16


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def serve(impl: str) -> None:
    """The server process: print the port, then serve until killed."""
    import uvicorn

    from hvfleet.server.connection import http_protocol

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, http=http_protocol(impl), loop="uvloop", log_level="error",  # type: ignore[arg-type]
                            lifespan="off", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def _request(post: bool) -> bytes:
    if post:
        return (b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(BODY)) + BODY
    return b"GET /x HTTP/1.1\r\nHost: h\r\nAccept: application/json\r\n\r\n"


def _read_answers(sock: socket.socket, n: int) -> None:
    answer = b"HTTP/1.1 200 OK"
    data = b""
    while data.count(answer) < n or not data.endswith(b"ok"):
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        data += chunk


def drive(port: int, requests: int, post: bool, pipelined: bool) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        one = _request(post)
        if pipelined:
            batch = one * PIPELINE
            for _ in range(requests // PIPELINE):
                sock.sendall(batch)
                _read_answers(sock, PIPELINE)
        else:
            for _ in range(requests):
                sock.sendall(one)
                _read_answers(sock, 1)


CASES = [("GET", False, False), ("POST 4 KiB", True, False),
         ("GET x16 pipelined", False, True), ("POST 4 KiB x16 pipelined", True, True)]


def h11_parse(cls: type[Any], post: bool, reps: int = 300) -> float:
    """µs of process CPU per request for `cls` to parse PIPELINE requests held
    in one buffer and answer each (h11 reads the next head once answered)."""
    import time

    import h11

    data = _request(post) * PIPELINE
    started = time.process_time()
    for _ in range(reps):
        conn = cls(h11.SERVER)
        conn.receive_data(data)
        for _ in range(PIPELINE):
            while not isinstance(conn.next_event(), h11.EndOfMessage):
                pass
            conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
            conn.send(h11.EndOfMessage())
            conn.start_next_cycle()
    return (time.process_time() - started) / (reps * PIPELINE) * 1e6


def h11_parse_figures(rounds: int) -> None:
    import h11

    from hvfleet.server.connection import _HeadKeepingConnection

    print(f"h11 CPU per request (µs), {PIPELINE} requests in one buffer, median of {rounds} rounds")
    for post in (False, True):
        plain, keeping = [], []
        for _ in range(rounds):
            plain.append(h11_parse(h11.Connection, post))
            keeping.append(h11_parse(_HeadKeepingConnection, post))
        ratios = [k / p for k, p in zip(keeping, plain, strict=True)]
        print(f"  {'POST 4 KiB' if post else 'GET':12s} h11.Connection {statistics.median(plain):6.2f}  "
              f"_HeadKeepingConnection {statistics.median(keeping):6.2f}  ratio "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


def one_run(src: Path, impl: str, requests: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen([sys.executable, __file__, "--serve", impl], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        drive(port, 200, False, False)  # warm up
        out: dict[str, float] = {}
        for name, post, pipelined in CASES:
            before = cpu_seconds(proc.pid)
            drive(port, requests, post, pipelined)
            out[name] = (cpu_seconds(proc.pid) - before) / requests * 1e6
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--impl", default="httptools", choices=["httptools", "h11"])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--base-src", help="also run the server from this src directory, in turns")
    ap.add_argument("--h11-parse", action="store_true", help="h11's parse alone, in this process")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.h11_parse:
        sys.path.insert(0, str(ROOT / "src"))
        h11_parse_figures(args.rounds)
        return
    checkouts = {"head": ROOT / "src"}
    if args.base_src:
        checkouts["base"] = Path(args.base_src).resolve()
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in checkouts}
    for i in range(args.rounds):
        order = list(checkouts) if i % 2 == 0 else list(reversed(checkouts))
        for key in order:
            runs[key].append(one_run(checkouts[key], args.impl, args.requests))
    print(f"server CPU per request (µs, user+sys), {args.impl}, {args.requests} requests "
          f"per case, median of {args.rounds} rounds")
    for name, _, _ in CASES:
        line = f"  {name:26s} head {statistics.median(r[name] for r in runs['head']):7.1f}"
        if "base" in runs:
            base = statistics.median(r[name] for r in runs["base"])
            ratios = [h[name] / b[name] for h, b in zip(runs["head"], runs["base"], strict=True)]
            line += (f"  base {base:7.1f}  head/base {statistics.median(ratios):.3f} "
                     f"({min(ratios):.3f}-{max(ratios):.3f})")
        print(line)


if __name__ == "__main__":
    main()
