"""gzip for the Placement API's large answers, as kube-apiserver compresses
its own: an answer of at least `MIN_BYTES` (128 KiB, kube-apiserver's
threshold) goes out gzip-encoded to a client whose `Accept-Encoding` takes
gzip (requests, and so keystoneauth and Nova's scheduler, sends `gzip,
deflate`); any other client gets the bytes as they are. A kept answer (the
allocation candidates' body, kept with the provider graph) is compressed once:
the compressed bytes are kept beside it, by the body's identity, for the few
bodies served last, so a repeated query costs a lookup again."""

from __future__ import annotations

import gzip
import threading

MIN_BYTES = 128 * 1024
# Level 1: the 444 KiB candidates body of 1,000 providers to 15 KiB in ~1 ms
# of CPU, once per graph (level 6: 14 KiB in ~2.6 ms); the client decodes it
# in ~0.5 ms.
LEVEL = 1
# Compressed bodies kept (by the identity of the body they encode).
KEPT = 16


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an `Accept-Encoding` header takes gzip (`gzip`, `x-gzip` or
    `*`, with a q-value above 0; an explicit `gzip;q=0` refuses it)."""
    if not accept_encoding:
        return False
    taken: dict[str, bool] = {}
    for item in accept_encoding.split(","):
        name, _, params = item.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        taken[name.strip().lower()] = q > 0
    for name in ("gzip", "x-gzip"):
        if name in taken:
            return taken[name]
    return taken.get("*", False)


class GzipKept:
    """gzip bodies kept by the identity of the bytes they encode."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._bodies: dict[int, tuple[bytes, bytes]] = {}
        self._lock = threading.Lock()

    def kept(self, body: bytes) -> bytes | None:
        """The compressed `body`, if kept (at once: safe on an event loop)."""
        held = self._bodies.get(id(body))
        return held[1] if held is not None and held[0] is body else None

    def compress(self, body: bytes) -> bytes:
        """The compressed `body`, made (in the caller's thread) unless kept."""
        out = self.kept(body)
        if out is not None:
            return out
        out = gzip.compress(body, compresslevel=LEVEL, mtime=0)
        with self._lock:
            while len(self._bodies) >= self._kept:
                self._bodies.pop(next(iter(self._bodies)))  # the oldest
            # The body is held too: its id stays its own while it is kept here.
            self._bodies[id(body)] = (body, out)
        return out
