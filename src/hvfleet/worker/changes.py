"""Whether anything changed in a set of directories since the last look, at
the cost of one non-blocking read: Linux inotify through libc (the standard
library has no binding).

A long-lived process that must not serve stale code or data (the CLI worker)
asks `changed()` before each request and only then runs its exact, slower
comparison of files' versions. Any event on a watched directory or on a file
in it counts: created, deleted, moved, written, attributes changed (a
`touch`), and a queue overflow. Where inotify is unavailable (no watch left,
another kernel) `changed()` always answers True, so the caller compares every
time: slower, never wrong.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
# | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_MASK = 0x002 | 0x004 | 0x008 | 0x040 | 0x080 | 0x100 | 0x200 | 0x400 | 0x800


class Changes:
    def __init__(self, directories: list[str]) -> None:
        self.fd = -1
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd < 0:
                return
            for d in sorted(set(directories)):
                if libc.inotify_add_watch(fd, os.fsencode(d), _MASK) < 0:
                    os.close(fd)  # a directory left unwatched: compare every time
                    return
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = -1

    def changed(self) -> bool:
        """True when some event arrived since the last call (or when nothing is
        watched); the events are consumed."""
        if self.fd < 0:
            return True
        seen = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return seen
            if not data:
                return seen
            seen = True

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
