"""A small JSON client for the OpenStack Placement API, on the standard library.

It keeps one HTTP/1.1 connection open (Placement answers thousands of small
requests in a sync or a differential test, and a new TCP connection each time
would dominate), sends the microversion header on every request, and turns
transport failures into `Unavailable` and 4xx/5xx answers into `PlacementError`
carrying the status and Placement's own error text.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

from hvfleet.model.errors import HvfleetError, InvalidInput, Unavailable

# 1.28 gives consumer generations, 1.34 allocation request mappings, 1.36 is the
# newest version whose allocation bodies do not require a consumer_type.
DEFAULT_MICROVERSION = "1.36"


class PlacementError(HvfleetError):
    """Placement refused a request; `status` is the HTTP status."""

    def __init__(self, method: str, path: str, status: int, detail: str) -> None:
        super().__init__(f"placement {method} {path}: HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class PlacementClient:
    def __init__(
        self,
        url: str,
        token: str = "admin",
        *,
        microversion: str = DEFAULT_MICROVERSION,
        timeout: float = 60.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise InvalidInput(f"placement url: {url!r} is not an http(s) URL")
        self.url = url.rstrip("/")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port
        self._prefix = parsed.path.rstrip("/")
        self._token = token
        self.microversion = microversion
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = (
                http.client.HTTPSConnection
                if self._scheme == "https"
                else http.client.HTTPConnection
            )
            self._conn = cls(self._host, self._port, timeout=self._timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self, method: str, path: str, body: Any = None, *, expect: tuple[int, ...] = ()
    ) -> tuple[int, Any]:
        """Send one request; returns (status, decoded JSON or None). A status in
        `expect` is returned even when it is an error; other errors raise."""
        headers = {
            "Accept": "application/json",
            "OpenStack-API-Version": f"placement {self.microversion}",
            "X-Auth-Token": self._token,
        }
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
                break
            except (TimeoutError, http.client.HTTPException, OSError) as exc:
                self.close()
                # A kept-alive connection the server closed: retry once on a new one.
                if attempt == 2:
                    raise Unavailable(f"placement {self.url}: {method} {path}: {exc}") from exc
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        decoded: Any = json.loads(raw) if raw and raw.lstrip()[:1] in (b"{", b"[") else None
        if status >= 400 and status not in expect:
            raise PlacementError(method, path, status, _detail(decoded, raw))
        return status, decoded

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def __enter__(self) -> PlacementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _detail(decoded: Any, raw: bytes) -> str:
    if isinstance(decoded, dict) and isinstance(decoded.get("errors"), list) and decoded["errors"]:
        first = decoded["errors"][0]
        if isinstance(first, dict):
            return str(first.get("detail") or first.get("title") or first).replace("\n", " ")
    return raw.decode(errors="replace")[:200].replace("\n", " ")
