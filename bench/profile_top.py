"""Where a server's CPU goes, from a `py-spy record --format raw` file (as
bench/replicas.py --profile writes): the functions with the most samples,
inclusive and self, as shares of all samples; per thread with --threads.

    .venv/bin/python bench/profile_top.py FILE [--top 40] [--match hvfleet] [--threads]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def short(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    file = m["file"]
    for marker in ("site-packages/", "src/", "lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{m['func']} ({file})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--match", default="", help="only functions whose file or name contains this")
    parser.add_argument("--threads", action="store_true", help="the share of each thread first")
    parser.add_argument("--thread", default="", help="only samples of threads whose name contains this")
    args = parser.parse_args()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in Path(args.file).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        start = 0
        if frames and frames[0].startswith("process "):
            start = 1
        if len(frames) > start and frames[start].startswith("thread "):
            if args.thread not in frames[start]:
                continue
            threads[frames[start]] += count
            start += 1
        names = [short(f) for f in frames[start:]]
        total += count
        for name in set(names):
            inclusive[name] += count
        if names:
            own[names[-1]] += count
    print(f"{total} samples")
    if args.threads:
        # bench/replicas.py --profile writes each thread's CPU seconds beside the samples.
        cpu_file = Path(args.file).with_suffix(".cpu")
        cpu = {}
        if cpu_file.exists():
            for row in cpu_file.read_text().split("\n"):
                if row:
                    tid, sec = row.split()
                    cpu[tid] = float(sec)
        for name, n in threads.most_common():
            tid = re.search(r"\((\d+)\)", name)
            used = cpu.get(tid[1], 0.0) if tid else 0.0
            print(f"{100 * n / total:6.1f}%  {used:6.2f} s CPU  {name}")
        print(f"threads' CPU: {sum(cpu.values()):.2f} s in all")
    print("\ninclusive")
    for name, n in [(k, v) for k, v in inclusive.most_common() if args.match in k][: args.top]:
        print(f"{100 * n / total:6.1f}%  {name}")
    print("\nself")
    for name, n in [(k, v) for k, v in own.most_common() if args.match in k][: args.top]:
        print(f"{100 * n / total:6.1f}%  {name}")


if __name__ == "__main__":
    main()
