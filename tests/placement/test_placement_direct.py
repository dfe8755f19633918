"""The allocation candidates GET is answered ahead of the app's middleware and
router (`placement.Direct`): whatever it is asked, it answers as the router's
way to the same endpoint does (status, headers, body; request ids and the
clock's `last-modified` aside), and every other method of that path still
goes through the router."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.server.placement import PlacementApp
from hvfleet.store import open_store
from hvfleet.store.tokens import issue_token
from tests.placement.support import _fleet
from tests.support.loops import run_on_own_thread

PATH = "/placement/allocation_candidates"
# Per request: query, role (None: no token), microversion header, other headers.
ASKED: list[tuple[str, str | None, str | None, dict[str, str]]] = [
    ("resources=VCPU:1", "admin", "placement 1.39", {}),
    ("resources=VCPU:1", "admin", "placement 1.39", {}),  # now the kept body
    ("resources=VCPU:1,MEMORY_MB:1024&limit=1", "scheduler", "placement 1.39", {}),
    ("resources=VCPU:1", "admin", "placement 1.14", {}),  # before last-modified
    ("resources=VCPU:1", "admin", "placement latest", {}),
    ("resources=VCPU:1", "admin", None, {}),  # no header: 1.0, where candidates do not exist
    ("resources=VCPU:1", "admin", "placement 1.9", {}),
    ("resources=VCPU:1", "admin", "placement 2.0", {}),  # not served: 406
    ("resources=VCPU:1", "admin", "placement 1.39", {"accept": "text/html"}),
    ("resources=VCPU:1", None, "placement 1.39", {}),  # no token: 401
    ("resources=VCPU:1", "viewer", "placement 1.39", {}),  # not the viewer's: 403
    ("resources=VCPU:x", "admin", "placement 1.39", {}),  # 400
    ("", "admin", "placement 1.39", {}),  # no resources: 400
    ("resources=VCPU:1", "admin", "placement 1.39", {"content-length": "x", "content-type": "a/b"}),
]
VOLATILE = {"openstack-request-id", "x-openstack-request-id", "last-modified"}


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[Starlette, dict[str, str]]]:
    d = Path(tempfile.mkdtemp())
    store = open_store(f"sqlite:///{d}/hvfleet.db")
    _fleet(store)
    tokens = {}
    for role in ("admin", "scheduler", "viewer"):
        _, tokens[role] = issue_token(store, role, manager="test", now=datetime.now(UTC),  # type: ignore[arg-type]
                                      ttl=None, name=f"t-{role}")
    yield create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False), tokens
    store.close()


def _scope(method: str, query: str, token: str | None, version: str | None,
           extra: dict[str, str]) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1"), (b"accept", b"application/json")]
    headers = [(k, v) for k, v in headers if k.decode() not in extra]
    if token is not None:
        headers.append((b"x-auth-token", token.encode()))
    if version is not None:
        headers.append((b"openstack-api-version", version.encode()))
    headers += [(k.encode(), v.encode()) for k, v in extra.items()]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "https", "path": PATH, "raw_path": PATH.encode(), "query_string": query.encode(),
            "root_path": "", "server": ("127.0.0.1", 8443), "client": ("127.0.0.1", 50000),
            "headers": headers}


async def _ask(app: Any, scope: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = sent[0]["status"]
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    body = b"".join(m.get("body", b"") for m in sent[1:])
    doc: Any = body.decode()
    if headers.get("content-type", "").startswith("application/json") and body:
        doc = json.loads(body)
        for err in doc.get("errors", []) if isinstance(doc, dict) else []:
            err.pop("request_id")
    assert ("last-modified" in headers) == ("cache-control" in headers)
    return status, {k: v for k, v in headers.items() if k not in VOLATILE}, (doc, "last-modified" in headers)


def test_the_candidates_get_answered_before_the_router_answers_as_the_router_does(
        app: tuple[Starlette, dict[str, str]]) -> None:
    api, tokens = app
    assert isinstance(api, PlacementApp)

    async def both() -> list[tuple[Any, Any]]:
        out = []
        for query, role, version, extra in ASKED:
            scope = _scope("GET", query, tokens[role] if role else None, version, extra)
            assert api.direct.find(scope) is not None
            direct = await _ask(api, dict(scope))
            routed = await _ask(lambda *a: Starlette.__call__(api, *a), dict(scope))  # the router's way
            out.append((direct, routed))
        return out

    answers = run_on_own_thread(both())
    statuses = [direct[0] for direct, _ in answers]
    assert statuses == [200, 200, 200, 200, 200, 404, 404, 406, 406, 401, 403, 400, 400, 400]
    for (query, role, version, _), (direct, routed) in zip(ASKED, answers, strict=True):
        assert direct == routed, (query, role, version)
    assert answers[0][0][2][1] and not answers[3][0][2][1]  # last-modified since 1.15 only


@pytest.mark.parametrize("method", ["HEAD", "POST", "PUT", "DELETE"])
def test_other_methods_of_the_candidates_path_go_through_the_router(
        app: tuple[Starlette, dict[str, str]], method: str) -> None:
    api, tokens = app
    scope = _scope(method, "resources=VCPU:1", tokens["admin"], "placement 1.39", {})
    assert api.direct.find(scope) is None
    status, headers, (doc, _) = run_on_own_thread(_ask(api, scope))
    assert status == 405 and headers["allow"] == "GET"
    if method != "HEAD":
        assert doc["errors"][0]["status"] == 405
