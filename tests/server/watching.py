"""A watch stream read in a thread, for the API tests."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from tests.server.objects import HV
from tests.server.running import Api


class Watcher:
    """Reads one watch stream in a thread; keeps (arrival time, event)."""

    def __init__(self, api: Api, params: dict[str, Any], token: str = "ops-token",
                 headers: dict[str, str] | None = None, path: str = HV) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.conn = http.client.HTTPConnection("127.0.0.1", api.server.port, timeout=60)
        query = urllib.parse.urlencode({"watch": "true", **params})
        self.conn.request("GET", f"{path}?{query}",
                          headers={"Authorization": f"Bearer {token}", **(headers or {})})
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while line := self.response.readline():
                if line.strip():
                    self.events.append((time.monotonic(), json.loads(line)))
        except Exception:  # closed under the reader: the stream simply ends here
            pass
        finally:
            self.done.set()

    def wait_for(self, test: Callable[[list[dict[str, Any]]], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not test(self.kinds()):
            if time.monotonic() > deadline:
                raise AssertionError(f"watch did not see it in {timeout}s: {self.kinds()}")
            time.sleep(0.01)

    def kinds(self) -> list[dict[str, Any]]:
        return [e for _, e in self.events]

    def close(self) -> None:
        if self.conn.sock is not None:
            with contextlib.suppress(OSError):
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()
        self.done.wait(5)


def names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"]
