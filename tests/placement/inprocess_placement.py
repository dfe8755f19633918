"""Real OpenStack Placement 16.0 in this process: its own WSGI application
(placement.wsgi.init_application) on SQLite in tmpfs, called with webob
requests, no sockets. For the candidates differential, the gabbi ports and
the benchmark: a request costs Placement's handler and SQL, not HTTP.

Placement reads its configuration once per process (oslo.config's global
CONF), so there is one instance per process; `reset()` empties it between
fleets. Also: `Fleet`, a provider fleet loaded into both Placement and a
`ProviderGraph`, so the two sides see the same numbers.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hvfleet.placement.graph import Inventory, Provider, ProviderGraph

PROJECT = "5d2f0c1e6a0b4ec5b1e0a2f3c4d5e6f7"
USER = "8a1b2c3d4e5f40718293a4b5c6d7e8f9"

_APP: Callable[..., Any] | None = None
_WORKDIR: str | None = None


def workdir() -> str:
    """Where Placement's database and log live (removed at exit)."""
    app()
    assert _WORKDIR is not None
    return _WORKDIR


def app() -> Callable[..., Any]:
    """Placement's WSGI application, started on first use (about 8 s: its
    database migrations)."""
    global _APP, _WORKDIR
    if _APP is None:
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        d = _WORKDIR = tempfile.mkdtemp(prefix="hvfleet-placement-", dir=shm)
        atexit.register(shutil.rmtree, d, ignore_errors=True)
        with open(os.path.join(d, "placement.conf"), "w") as f:
            f.write(
                f"[DEFAULT]\nlog_file = {d}/placement.log\ndebug = False\n"
                f"[placement_database]\nconnection = sqlite:///{d}/placement.db\n"
                "sync_on_startup = True\n[api]\nauth_strategy = noauth2\n"
            )
        os.environ["OS_PLACEMENT_CONFIG_DIR"] = d
        from placement.wsgi import init_application

        _APP = init_application()
    return _APP


def call(method: str, path: str, body: Any = None, microversion: str = "latest") -> tuple[int, Any]:
    import webob

    req = webob.Request.blank(
        path,
        method=method,
        headers={
            "x-auth-token": "admin",
            "OpenStack-API-Version": f"placement {microversion}",
            "accept": "application/json",
        },
    )
    if body is not None:
        req.body = json.dumps(body).encode()
        req.content_type = "application/json"
    resp = req.get_response(app())
    return resp.status_int, json.loads(resp.body) if resp.body else None


def ok(method: str, path: str, body: Any = None, microversion: str = "latest") -> Any:
    status, doc = call(method, path, body, microversion)
    assert status < 300, f"{method} {path}: {status} {doc}"
    return doc


def error_message(doc: Any) -> str:
    """The message of Placement's 400 body, without webob's preamble (its
    newlines are spaces: compare with `flat`)."""
    detail: str = doc["errors"][0]["detail"]
    return detail.split("\n\n", 1)[-1].strip()


def flat(detail: str) -> str:
    """A message as Placement's error body shows it: newlines as spaces."""
    return detail.replace("\n", " ").strip()


def query_string(params: Iterable[tuple[str, str]]) -> str:
    return urllib.parse.urlencode(list(params))


@dataclass
class ProviderSpec:
    uuid: str
    name: str
    parent: str | None
    inventories: dict[str, Inventory] = field(default_factory=dict)
    traits: frozenset[str] = frozenset()
    aggregates: frozenset[str] = frozenset()


@dataclass
class Fleet:
    providers: list[ProviderSpec]  # parents before children
    allocations: list[dict[str, dict[str, int]]] = field(default_factory=list)  # per consumer

    def root_of(self, uuid: str) -> str:
        by = {p.uuid: p for p in self.providers}
        while by[uuid].parent is not None:
            uuid = by[uuid].parent  # type: ignore[assignment]
        return uuid

    def graph(self) -> ProviderGraph:
        used: dict[str, dict[str, int]] = {}
        for alloc in self.allocations:
            for rp, res in alloc.items():
                for rc, n in res.items():
                    used.setdefault(rp, {})[rc] = used.get(rp, {}).get(rc, 0) + n
        return ProviderGraph(
            {
                p.uuid: Provider(
                    uuid=p.uuid,
                    name=p.name,
                    generation=0,
                    parent_uuid=p.parent,
                    root_uuid=self.root_of(p.uuid),
                    inventories=dict(p.inventories),
                    usages=used.get(p.uuid, {}),
                    traits=p.traits,
                    aggregates=p.aggregates,
                )
                for p in self.providers
            }
        )


_loaded: list[str] = []
_consumers: list[str] = []
_custom: set[str] = set()


def ensure_custom(classes: Iterable[str] = (), traits: Iterable[str] = ()) -> None:
    for rc in classes:
        if rc.startswith("CUSTOM_") and rc not in _custom:
            ok("PUT", f"/resource_classes/{rc}", microversion="1.7")
            _custom.add(rc)
    for t in traits:
        if t.startswith("CUSTOM_") and t not in _custom:
            ok("PUT", f"/traits/{t}")
            _custom.add(t)


def reset() -> None:
    """Remove what the last `load` put in."""
    # Tolerates what is already gone: a failed load leaves a partial fleet.
    for c in _consumers:
        status, doc = call("DELETE", f"/allocations/{c}")
        assert status in (204, 404), doc
    _consumers.clear()
    for u in reversed(_loaded):
        status, doc = call("DELETE", f"/resource_providers/{u}")
        assert status in (204, 404), doc
    _loaded.clear()


def load(fleet: Fleet) -> None:
    reset()
    for p in fleet.providers:
        body: dict[str, Any] = {"name": p.name, "uuid": p.uuid}
        if p.parent is not None:
            body["parent_provider_uuid"] = p.parent
        ok("POST", "/resource_providers", body)
        _loaded.append(p.uuid)
        gen = 0
        if p.inventories:
            ensure_custom(classes=p.inventories)
            invs = {
                rc: {
                    "total": i.total,
                    "reserved": i.reserved,
                    "min_unit": i.min_unit,
                    "max_unit": i.max_unit,
                    "step_size": i.step_size,
                    "allocation_ratio": i.allocation_ratio,
                }
                for rc, i in p.inventories.items()
            }
            gen = ok(
                "PUT",
                f"/resource_providers/{p.uuid}/inventories",
                {"resource_provider_generation": gen, "inventories": invs},
            )["resource_provider_generation"]
        if p.traits:
            ensure_custom(traits=p.traits)
            gen = ok(
                "PUT",
                f"/resource_providers/{p.uuid}/traits",
                {"resource_provider_generation": gen, "traits": sorted(p.traits)},
            )["resource_provider_generation"]
        if p.aggregates:
            ok(
                "PUT",
                f"/resource_providers/{p.uuid}/aggregates",
                {"resource_provider_generation": gen, "aggregates": sorted(p.aggregates)},
            )
    body = {}
    for n, alloc in enumerate(fleet.allocations):
        consumer = f"00000000-0000-4000-8000-{n:012d}"
        body[consumer] = {
            "allocations": {rp: {"resources": res} for rp, res in alloc.items()},
            "project_id": PROJECT,
            "user_id": USER,
        }
        _consumers.append(consumer)
    if body:
        ok("POST", "/allocations", body, microversion="1.27")
