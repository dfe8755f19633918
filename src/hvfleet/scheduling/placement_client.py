"""A small JSON client for the OpenStack Placement API, on the standard library.

It keeps one HTTP/1.1 connection open (Placement answers thousands of small
requests in a sync or a differential test, and a new TCP connection each time
would dominate), sends the microversion header on every request, and turns
transport failures into `Unavailable` and 4xx/5xx answers into `PlacementError`
carrying the status, Placement's own error text and its error code. A 409 whose
code is `placement.concurrent_update` (a stale provider or consumer generation)
is `GenerationConflict`: the one answer a caller re-reads and retries on.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from hvfleet.model.errors import HvfleetError, InvalidInput, Unavailable

if TYPE_CHECKING:
    # http.client (and ssl with it) loads with the first request: `placement
    # sync` option defaults come from this package, and `fit` must not pay.
    import http.client

# 1.28 gives consumer generations, 1.34 allocation request mappings, 1.36 is the
# newest version whose allocation bodies do not require a consumer_type.
DEFAULT_MICROVERSION = "1.36"


# From 1.7 on, PUT /resource_classes/{name} creates a custom class or confirms
# it exists (201 or 204); before, only POST creates one and answers 409 for
# one that exists.
IDEMPOTENT_RESOURCE_CLASSES = (1, 7)


def microversion_tuple(text: str) -> tuple[int, int]:
    """"1.36" → (1, 36); "latest" counts as newer than any number."""
    if text == "latest":
        return (10**6, 0)
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor)
    except ValueError:
        raise InvalidInput(f"placement microversion: {text!r} is not MAJOR.MINOR") from None


# Placement's error code (microversion 1.23+) for a write that named a stale
# resource provider or consumer generation.
CONCURRENT_UPDATE = "placement.concurrent_update"


class PlacementError(HvfleetError):
    """Placement refused a request; `status` is the HTTP status, `code` Placement's
    error code ("placement.undefined_code" when it gives none)."""

    def __init__(self, method: str, path: str, status: int, detail: str, code: str = "") -> None:
        super().__init__(f"placement {method} {path}: HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.code = code


class GenerationConflict(PlacementError):
    """A write named a provider or consumer generation that is no longer current:
    re-read and retry."""


def placement_error(method: str, path: str, status: int, decoded: Any, raw: bytes) -> PlacementError:
    code = _code(decoded)
    cls = GenerationConflict if status == 409 and code == CONCURRENT_UPDATE else PlacementError
    return cls(method, path, status, _detail(decoded, raw), code)


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
        import http.client

        if self._conn is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
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
        import http.client

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
            raise placement_error(method, path, status, decoded, raw)
        return status, decoded

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    # -- typed calls the push uses -------------------------------------------------------

    def inventories(self, rp_uuid: str) -> tuple[int, dict[str, dict[str, Any]]]:
        """(resource_provider_generation, inventories by resource class)."""
        doc = self.get(f"/resource_providers/{rp_uuid}/inventories")
        return int(doc["resource_provider_generation"]), dict(doc["inventories"])

    def put_inventories(
        self, rp_uuid: str, generation: int, inventories: dict[str, dict[str, Any]]
    ) -> int:
        """Replace all inventories of a provider if its generation is still
        `generation` (else GenerationConflict); returns the new generation."""
        body = {"resource_provider_generation": generation, "inventories": inventories}
        doc = self.request("PUT", f"/resource_providers/{rp_uuid}/inventories", body)[1]
        return int(doc["resource_provider_generation"])

    def ensure_resource_class(self, name: str) -> bool:
        """Make the custom resource class `name` exist; True when this call
        created it, False when it already existed."""
        path = f"/resource_classes/{urllib.parse.quote(name)}"
        if microversion_tuple(self.microversion) >= IDEMPOTENT_RESOURCE_CLASSES:
            return self.request("PUT", path)[0] == 201
        status, _ = self.request("POST", "/resource_classes", {"name": name}, expect=(409,))
        return status != 409

    def consumer_allocations(self, consumer: str) -> dict[str, Any]:
        """GET /allocations/{consumer}: allocations, project_id, user_id and
        consumer_generation (the last three absent for an unknown consumer)."""
        return dict(self.get(f"/allocations/{urllib.parse.quote(consumer)}"))

    def put_allocations(self, consumer: str, body: dict[str, Any]) -> None:
        self.request("PUT", f"/allocations/{urllib.parse.quote(consumer)}", body)

    def delete_allocations(self, consumer: str) -> None:
        """Remove all of a consumer's allocations; one already gone is not an error."""
        self.request("DELETE", f"/allocations/{urllib.parse.quote(consumer)}", expect=(404,))

    def __enter__(self) -> PlacementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _code(decoded: Any) -> str:
    if isinstance(decoded, dict) and isinstance(decoded.get("errors"), list) and decoded["errors"]:
        first = decoded["errors"][0]
        if isinstance(first, dict):
            return str(first.get("code") or "")
    return ""


def _detail(decoded: Any, raw: bytes) -> str:
    if isinstance(decoded, dict) and isinstance(decoded.get("errors"), list) and decoded["errors"]:
        first = decoded["errors"][0]
        if isinstance(first, dict):
            return str(first.get("detail") or first.get("title") or first).replace("\n", " ")
    return raw.decode(errors="replace")[:200].replace("\n", " ")
