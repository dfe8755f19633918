"""The shared etcd stream read at a pace (`chunked_lines` `pace`, `hvfleet
serve --follow-pace`): messages that come faster than the pace are read
together, in fewer reads, and come out as sent; one after a quiet spell is
read at once; a reader waiting for a revision (`hurry`) cuts the pause short;
the setting takes seconds from 0 to 1 and nothing else (exit 2 otherwise)."""

from __future__ import annotations

import io
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model.errors import InvalidInput
from hvfleet.server.serve import MAX_FOLLOW_PACE_S, follow_pace
from hvfleet.store.etcd_watch import Hurry, chunked_lines


class _CountingReader(io.RawIOBase):
    """A socket's reading end that counts the reads that returned data."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reads = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        n = self.sock.recv_into(b)
        if n:
            self.reads += 1
        return n


def _chunk(line: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(line), line)


def _send(sock: socket.socket, lines: list[bytes], every: float, end: bool = True) -> threading.Thread:
    def run() -> None:
        for line in lines:
            sock.sendall(_chunk(line))
            time.sleep(every)
        if end:
            sock.sendall(b"0\r\n\r\n")

    t = threading.Thread(target=run)
    t.start()
    return t


def _timed(lines: Iterator[bytes]) -> Iterator[tuple[bytes, float]]:
    for line in lines:
        yield line, time.monotonic()


@pytest.mark.parametrize("pace", [0.0, 0.05])
def test_messages_faster_than_the_pace_are_read_together_and_come_out_as_sent(pace: float) -> None:
    lines = [b'{"n":%d,"pad":"%s"}\n' % (i, b"x" * (i * 37 % 300)) for i in range(60)]
    a, b = socket.socketpair()
    with a, b:
        raw = _CountingReader(b)
        sender = _send(a, lines, every=0.002)
        got = list(chunked_lines(io.BufferedReader(raw), pace))
        sender.join()
    assert got == lines
    if pace:
        # 60 messages 2 ms apart: about 0.12 s, so about three paced reads (a
        # loaded machine makes fewer, never more than the pace allows).
        assert raw.reads <= 0.12 / pace + 3, raw.reads
    else:
        assert raw.reads >= 20, raw.reads  # each message read as it came (a few together at most)


@pytest.mark.parametrize("make_hurry", [Hurry, threading.Event])
def test_a_message_after_a_quiet_spell_is_read_at_once_and_a_hurry_cuts_the_pause_short(
        make_hurry: type[Hurry] | type[threading.Event]) -> None:
    a, b = socket.socketpair()
    hurry = make_hurry()
    with a, b:
        reader = _timed(chunked_lines(io.BufferedReader(_CountingReader(b)), 2.0, hurry))
        a.sendall(_chunk(b"first\n"))
        started = time.monotonic()
        line, at = next(reader)
        assert line == b"first\n" and at - started < 1.0  # no pause before the first read
        # The next message comes at once, within the pace: it waits for the pace ...
        a.sendall(_chunk(b"second\n"))
        sent = time.monotonic()
        threading.Timer(0.3, hurry.set).start()
        line, at = next(reader)
        # ... until someone hurries the reader (0.3 s), well before the 2 s pace.
        assert line == b"second\n" and 0.25 < at - sent < 1.5, at - sent
        a.sendall(_chunk(b"third\n"))
        sent = time.monotonic()
        line, at = next(reader)
        # The pace counts from the last read that emptied the socket: this one waits.
        assert line == b"third\n" and at - sent > 1.0, at - sent
        a.sendall(b"0\r\n\r\n")
        assert list(reader) == []


def test_a_hurry_ends_a_wait_when_set_from_another_thread_or_before_it_and_closes_its_pipe() -> None:
    hurry = Hurry()
    started = time.monotonic()
    assert hurry.wait(0.2) is False  # nobody hurried: the whole timeout
    assert time.monotonic() - started >= 0.19
    threading.Timer(0.1, hurry.set).start()
    started = time.monotonic()
    assert hurry.wait(5.0) is True  # set from another thread: at once, not after 5 s
    assert time.monotonic() - started < 2.0
    assert hurry.is_set() and hurry.wait(5.0) is True  # still set: no wait at all
    hurry.clear()
    assert not hurry.is_set() and hurry.wait(0.05) is False  # the drained pipe does not wake it
    hurry.set()
    hurry.set()  # twice before a clear: one byte, drained by one clear
    hurry.clear()
    started = time.monotonic()
    assert hurry.wait(0.1) is False and time.monotonic() - started >= 0.09
    pipe = hurry._pipe
    assert pipe is not None
    hurry.close()
    for fd in pipe:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert hurry.wait(5.0) is False  # closed (its store closing): no pause, no new pipe
    assert hurry._pipe is None
    # Set before its first wait (no pipe yet): the wait does not wait.
    early = Hurry()
    early.set()
    started = time.monotonic()
    assert early.wait(5.0) is True and time.monotonic() - started < 1.0
    early.close()


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5)))
def test_the_follow_pace_takes_seconds_from_0_to_1(value: float) -> None:
    if math.isfinite(value) and 0 <= value <= MAX_FOLLOW_PACE_S:
        assert follow_pace(value) == float(value)
    else:
        with pytest.raises(InvalidInput, match="follow-pace"):
            follow_pace(value)


def test_hvfleet_serve_refuses_a_bad_follow_pace_with_exit_2(tmp_path: Path) -> None:
    for bad in ("-1", "nan", "2"):
        done = subprocess.run(
            [sys.executable, "-m", "hvfleet", "serve", "--store", f"sqlite:///{tmp_path}/h.db",
             "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--follow-pace", bad],
            capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (bad, done.stderr)
        assert "follow-pace" in done.stderr, done.stderr
        assert not (tmp_path / "h.db").exists()  # refused before the store was opened


def test_a_fit_right_after_a_write_does_not_wait_for_the_pace(request: pytest.FixtureRequest) -> None:
    """The fleet index (what `fit` and Placement read) waits for the store's
    revision before it answers; over a feed paused by its pace, it cuts the
    pause short (`Store.follow_now`), so it answers at once and with the write,
    not at its 0.5 s bound without it."""
    import uuid

    from hvfleet.model import Hypervisor
    from hvfleet.scheduling.index import FleetIndex
    from hvfleet.store import open_store
    from hvfleet.store.ownership import agent_manager

    cluster = request.getfixturevalue("etcd_session")
    with open_store(cluster.url(prefix=f"/test-{uuid.uuid4().hex[:12]}")) as store:
        store.share_watches(pace=1.0)
        store.create(Hypervisor.model_validate({"metadata": {"name": "hv0"}}), agent_manager("hv0"))
        index = FleetIndex.from_store(store)
        stop = threading.Event()
        follower = index.follow_stream(store, stop)
        try:
            time.sleep(1.5)  # following, the pace long over
            host = store.get_hypervisor("hv0")
            first = store.update(host.model_copy(update={"status": host.status.model_validate(
                {"allocation": {"cpu": "1"}})}), agent_manager("hv0"))
            time.sleep(0.1)  # read at once (a quiet spell before): the feed now paces
            second = store.update(first.model_copy(update={"status": first.status.model_validate(
                {"allocation": {"cpu": "2"}})}), agent_manager("hv0"))
            began = time.monotonic()
            index.refresh(store)
            took = time.monotonic() - began
            assert index.revision >= int(second.metadata.resource_version or 0)
            assert took < 0.4, took
        finally:
            stop.set()
            follower.join(timeout=5)


@pytest.mark.parametrize("cut", [None, 300_000])
def test_a_message_larger_than_a_read_comes_out_whole(cut: int | None) -> None:
    """A line of several reads' worth (a long catch-up message), in one chunk
    or several, is read back as sent; a body cut off inside a chunk ends the
    reading (no wait for more) with the lines of the whole chunks before it,
    the last one maybe cut short (as any body cut off: its reader then fails
    to parse it and watches again)."""
    big = b'{"events":"' + b"x" * 1_500_000 + b'"}\n'
    lines = [b'{"n":1}\n', big, b'{"n":2}\n']
    body = b"".join(lines)
    size = cut or len(body)
    wire = b"".join(_chunk(body[i:i + size]) for i in range(0, len(body), size)) + b"0\r\n\r\n"
    assert list(chunked_lines(io.BufferedReader(io.BytesIO(wire)))) == lines
    got = list(chunked_lines(io.BufferedReader(io.BytesIO(wire[:len(wire) // 2]))))
    if cut is None:
        assert got == []  # the one chunk never came whole
    else:
        assert got[0] == lines[0] and big.startswith(got[1]) and len(got[1]) < len(big) and len(got) == 2
