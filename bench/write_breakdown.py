"""Where a replica's CPU per write goes, by part of the request path, from the
files `bench/replicas.py --profile DIR` writes for a phase (py-spy's raw
stacks, and each thread's CPU seconds beside them).

Each sample is put in the part of its innermost frame that names one (so
pydantic under `bodies.to_object` is the body's validation, and under
`encoding.decode` the decode of the stored object); a thread that only follows
(the etcd watch reader, the garbage collector, the token watch) is counted as
its own part. A thread's samples share its measured CPU seconds, so the
figures add up to the process's CPU; divided by the phase's writes, they are
milliseconds per write.

    .venv/bin/python bench/write_breakdown.py DIR/lease-1-r0.txt --writes 3000
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

from profile_top import short

# (part, pattern on "function (file)" as profile_top.short prints a frame);
# the first pattern a frame matches names its part.
PARTS: list[tuple[str, str]] = [
    ("TLS (ssl, asyncio sslproto)", r"\((ssl\.py|asyncio/sslproto\.py)\)"),
    ("audit line (JSON, logging, write)", r"\((hvfleet/server/audit\.py|logging/__init__\.py)\)"),
    ("metrics", r"prometheus_client/|store_metrics\.py"),
    ("token check", r"\((hvfleet/server/auth\.py|hvfleet/model/token\.py"
                    r"|hvfleet/server/impersonation\.py)\)"),
    ("authorization", r"^(precheck|authorize_write|ApiContext\.authorize\w*|RoleAuthorizer\.\w+) "
                      r"|hvfleet/server/identity\.py"),
    ("body: validation into the model", r"^to_object \(hvfleet/server/bodies\.py\)"),
    ("body: read and JSON parse", r"\((hvfleet/server/bodies\.py|hvfleet/model/documents\.py)\)"),
    ("stored object: decode", r"^decode \(hvfleet/store/encoding\.py\)"),
    ("stored object: encode and read back", r"\(hvfleet/store/encoding\.py\)"),
    ("ownership / managedFields", r"\(hvfleet/store/ownership\.py\)"),
    ("lifecycle rules", r"\(hvfleet/store/lifecycle\.py\)"),
    ("etcd gateway round trip (JSON, base64, http.client)", r"\(hvfleet/store/etcd_transport\.py\)"),
    ("store: other (etcd.py, sqlite.py, base)", r"\(hvfleet/store/"),
    ("answer: encoding and Response", r"^render \(|starlette/responses\.py"),
    ("watch fan-out to the API watcher", r"\(hvfleet/server/(watch|watch_stream)\.py\)"),
    ("dashboard (live state, history)", r"\(hvfleet/server/dashboard/"),
    ("handler (resources.py, guard.audited)", r"\(hvfleet/server/(resources|guard|context)\.py\)"),
    ("HTTP parsing (h11 / httptools, uvicorn protocol)",
     r"\((h11/|uvicorn/protocols/|hvfleet/server/connection\.py)"),
    ("thread hand-off (worker threads)",
     r"\((anyio/|starlette/concurrency\.py|concurrent/futures/|hvfleet/server/threads\.py)"),
    ("routing, middleware (Starlette, uvicorn)", r"\((starlette/|uvicorn/)"),
    ("event loop (asyncio, uvloop)", r"\((asyncio/|selectors\.py|uvloop/)"),
]
COMPILED = [(name, re.compile(p)) for name, p in PARTS]
# Threads that only follow the store: their samples are their own part.
FOLLOWERS = [("following: etcd watch reader thread", "etcd-watch"),
             ("following: garbage collector's watch", "garbage-collector"),
             ("following: token watch", "token-watch")]


# Leaf frames that are waits, not work: py-spy without --native cannot tell a
# thread blocked in these (or waiting for the GIL after them) from a running
# one. Their samples are left out; the thread's CPU is shared by the rest.
WAITS = re.compile(r"^(EpollSelector\.select|SocketIO\.readinto|Condition\.wait|Event\.wait|_worker|"
                   r"Queue\.get|GatewayConnection\._connection|sleep|select|poll) ")
WAIT = "waiting (left out)"


def part_of(thread: str, frames: list[str]) -> str:
    if frames and WAITS.match(frames[-1]):
        return WAIT
    for name, marker in FOLLOWERS:
        if marker in thread:
            return name
    for frame in reversed(frames):
        for name, pattern in COMPILED:
            if pattern.search(frame):
                return name
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--writes", type=int, required=True, help="the writes of the measured phase")
    parser.add_argument("--other", action="store_true", help="list the leaf frames counted as other")
    args = parser.parse_args()
    samples: dict[str, Counter[str]] = defaultdict(Counter)  # thread -> part -> samples
    others: Counter[str] = Counter()
    for line in Path(args.file).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        frames = stack.split(";")
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        thread = frames[0] if frames and frames[0].startswith("thread ") else ""
        names = [short(f) for f in frames[1 if thread else 0:]]
        part = part_of(thread, names)
        samples[thread][part] += int(count_text)
        if part == "other" and names:
            others[names[-1]] += int(count_text)
    cpu: dict[str, float] = {}
    cpu_file = Path(args.file).with_suffix(".cpu")
    for row in cpu_file.read_text().splitlines() if cpu_file.exists() else []:
        tid, sec = row.split()
        cpu[tid] = float(sec)
    seconds: Counter[str] = Counter()
    for thread, parts in samples.items():
        tid = re.search(r"\((\d+)\)", thread)
        used = cpu.get(tid[1], 0.0) if tid else 0.0
        total = sum(n for part, n in parts.items() if part != WAIT)
        for part, n in parts.items():
            if part == WAIT:
                continue
            # Without a thread's CPU figure, a sample counts as 1/250 s (py-spy's rate in replicas.py).
            seconds[part] += used * n / total if used else n / 250
    waits = sum(parts[WAIT] for parts in samples.values())
    print(f"{waits} of {sum(sum(p.values()) for p in samples.values())} samples were waits, left out")
    whole = sum(seconds.values())
    print(f"{args.file}: {whole:.2f} s CPU over {args.writes} writes = "
          f"{1000 * whole / args.writes:.2f} ms per write")
    for part, sec in seconds.most_common():
        print(f"{1000 * sec / args.writes:7.3f} ms  {100 * sec / whole:5.1f}%  {part}")
    if args.other:
        print("\nleaf frames counted as other:")
        for frame, n in others.most_common(25):
            print(f"{n:6d}  {frame}")


if __name__ == "__main__":
    main()
