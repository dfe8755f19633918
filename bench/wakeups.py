"""What one wake-up of a thread costs this machine in CPU, by the way it waits.

A replica following the fleet's writes is woken per burst it reads (the etcd
feed's pause and read, the event loop's wake-up for the API watchers), and
each wake-up costs the woken thread CPU of its own besides the work it wakes
for: on a virtual machine, a timer armed and fired, a halt left and entered,
are each an exit to the hypervisor. This times `--waits` waits of 10 ms in
each way a thread of hvfleet waits, as CPU time of the waiting thread
(`time.thread_time`), next to a `time.sleep` (the least a timed wait can
cost) in the same run: `threading.Event.wait` (the feed's pause before
session 9), a pipe polled (`etcd_watch.Hurry`, its pause now), a lock
acquired with a timeout, and a blocking read woken by another thread's
write (a socket read, as the feed's read of the etcd stream).

    .venv/bin/python bench/wakeups.py [--waits 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import threading
import time
from collections.abc import Callable

WAIT_S = 0.01


def cpu_per_wait(wait: Callable[[], object], n: int) -> float:
    started = time.thread_time()
    for _ in range(n):
        wait()
    return (time.thread_time() - started) / n


def socket_read(n: int) -> float:
    """CPU of the reading thread per read woken by data another thread sends every 10 ms."""
    a, b = socket.socketpair()
    with a, b:
        def send() -> None:
            for _ in range(n):
                time.sleep(WAIT_S)
                a.sendall(b"x" * 3000)

        sender = threading.Thread(target=send)
        sender.start()
        reader = b.makefile("rb")
        started = time.thread_time()
        got = 0
        while got < 3000 * n:
            got += len(reader.read1(1 << 18))
        used = (time.thread_time() - started) / n
        sender.join()
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waits", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    event = threading.Event()
    lock = threading.Lock()
    lock.acquire()
    r, _w = os.pipe()
    poll = select.poll()
    poll.register(r, select.POLLIN)
    ways: dict[str, Callable[[int], float]] = {
        "time.sleep (the peer)": lambda n: cpu_per_wait(lambda: time.sleep(WAIT_S), n),
        "threading.Event.wait": lambda n: cpu_per_wait(lambda: event.wait(WAIT_S), n),
        "poll of a pipe (Hurry)": lambda n: cpu_per_wait(lambda: poll.poll(WAIT_S * 1000), n),
        "Lock.acquire(timeout)": lambda n: cpu_per_wait(lambda: lock.acquire(timeout=WAIT_S), n),
        "socket read woken by data": socket_read,
    }
    got: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.rounds):
        for name, run in ways.items():
            got[name].append(run(args.waits))
    peer = statistics.median(got["time.sleep (the peer)"])
    print(f"\nCPU of the waiting thread per 10 ms wait, median of {args.rounds} round(s) of {args.waits}")
    print(f"{'wait':<28}{'CPU per wake-up':>18}{'vs time.sleep':>15}")
    for name, values in got.items():
        m = statistics.median(values)
        print(f"{name:<28}{m * 1e6:>15.1f} µs{m / peer:>14.2f}x")


if __name__ == "__main__":
    main()
