"""Placement 16.0's gabbi files about allocation candidates, run against
`hvfleet.placement.candidates`.

The fixtures: the provider layouts of Placement's own fixture classes
(SharedStorageFixture, NUMANetworkFixture, GranularFixture, … in
placement/tests/functional/fixtures/gabbits.py) are built as a
`ProviderGraph`. Their `start_fixture` code is run as written, with the
database helpers it calls (`tb.create_provider`, `tb.add_inventory`,
`tb.set_traits`, `tb.set_allocation`, …) replaced by ones that record
providers, inventories, traits, aggregates and allocations into a graph: a
port that cannot drift from the layouts the YAML files were written for.

The server: `CandidatesOnlyEdge`, a stand-in WSGI edge (named so: the real
one is `hvfleet.server.placement`, which does not serve candidates yet) that
answers `GET /allocation_candidates` with parse/find/render over that graph,
plus the few other calls these files make (`GET /traits`, `GET` a provider,
`PUT` its aggregates). Microversion header, 404 below 1.10, Placement's
error body and cache headers as Placement sends them.
"""

from __future__ import annotations

import json
import os
import threading
import types
import unittest
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import os_resource_classes
import os_traits
import yaml
from gabbi import fixture, handlers, suitemaker
from oslo_utils import uuidutils

import placement
from hvfleet.placement.candidates import (
    PlacementBadRequest,
    find_candidates,
    parse_candidates_query,
    render_candidates,
    render_candidates_json,
)
from hvfleet.placement.graph import MAX_INT, Inventory, Provider, ProviderGraph
from tests.placement.inprocess_placement import flat

FUNCTIONAL = Path(placement.__file__).parent / "tests/functional"
GABBITS = FUNCTIONAL / "gabbits"
FILES = [
    "allocation-candidates.yaml",
    "allocation-candidates-any-traits.yaml",
    "allocation-candidates-any-traits-groups.yaml",
    "allocation-candidates-bug-1792503.yaml",
    "allocation-candidates-mappings-numa.yaml",
    "allocation-candidates-mappings-sharing.yaml",
    "allocation-candidates-member-of.yaml",
    "allocation-candidates-root-required.yaml",
    "granular.yaml",
    "granular-same-subtree.yaml",
    "same-subtree-deep.yaml",
]
LATEST = (1, 39)


# ---------------------------------------------------------------------------
# The fixtures, recorded as a graph


@dataclass
class _Rp:
    uuid: str
    name: str
    parent_provider_uuid: str | None
    _context: object = None
    inventories: dict[str, Inventory] = field(default_factory=dict)
    traits: set[str] = field(default_factory=set)
    aggregates: set[str] = field(default_factory=set)
    generation: int = 0

    def set_aggregates(self, aggs: Iterable[str]) -> None:
        self.aggregates = set(aggs)
        self.generation += 1
        STATE.built = None


@dataclass
class Recorded:
    providers: dict[str, _Rp] = field(default_factory=dict)
    allocations: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # consumer
    classes: set[str] = field(default_factory=set)
    traits: set[str] = field(default_factory=set)
    built: ProviderGraph | None = None  # the graph of the current state

    def root(self, u: str) -> str:
        while (parent := self.providers[u].parent_provider_uuid) is not None:
            u = parent
        return u

    def graph(self) -> ProviderGraph:
        if self.built is None:
            self.built = self._build()
        return self.built

    def _build(self) -> ProviderGraph:
        used: dict[str, dict[str, int]] = {}
        for per_rp in self.allocations.values():
            for rp, res in per_rp.items():
                for rc, n in res.items():
                    used.setdefault(rp, {})[rc] = used.get(rp, {}).get(rc, 0) + n
        return ProviderGraph(
            {
                p.uuid: Provider(
                    uuid=p.uuid,
                    name=p.name,
                    generation=p.generation,
                    parent_uuid=p.parent_provider_uuid,
                    root_uuid=self.root(p.uuid),
                    inventories=dict(p.inventories),
                    usages=used.get(p.uuid, {}),
                    traits=frozenset(p.traits),
                    aggregates=frozenset(p.aggregates),
                )
                for p in self.providers.values()
            }
        )


STATE = Recorded()


class _Sentinels:
    """oslo_utils' uuidsentinel: one uuid per attribute name."""

    def __init__(self) -> None:
        self._made: dict[str, str] = {}

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._made.setdefault(name, str(uuid.uuid4()))


def _create_provider(context: object, name: str, *aggs: str, **kwargs: Any) -> _Rp:
    rp = _Rp(kwargs.get("uuid") or getattr(_uuids, name), name, kwargs.get("parent"))
    STATE.providers[rp.uuid] = rp
    if aggs:
        rp.set_aggregates(aggs)
    return rp


def _add_inventory(rp: _Rp, rc: str, total: int, **kwargs: Any) -> None:
    kwargs.setdefault("max_unit", total)
    STATE.classes.add(rc)
    rp.inventories[rc] = Inventory(total=total, **kwargs)
    rp.generation += 1


def _set_traits(rp: _Rp, *traits: str) -> None:
    STATE.traits.update(traits)
    rp.traits = set(traits)
    rp.generation += 1


def _ensure_consumer(ctx: object, user: object, project: object, consumer_id: str | None = None) -> str:
    return consumer_id or str(uuid.uuid4())


def _set_allocation(ctx: object, rp: _Rp, consumer: str, used: dict[str, int]) -> None:
    # Placement's replace_all: the consumer's allocations become these.
    STATE.allocations[consumer] = {rp.uuid: dict(used)}


class _ResourceClass:
    def __init__(self, context: object = None, name: str = "") -> None:
        self.name = name

    def create(self) -> None:
        STATE.classes.add(self.name)


_uuids = _Sentinels()
_tb = types.SimpleNamespace(
    create_provider=_create_provider,
    add_inventory=_add_inventory,
    set_traits=_set_traits,
    ensure_consumer=_ensure_consumer,
    set_allocation=_set_allocation,
    create_user_and_project=lambda ctx, prefix="fake": (None, None),
    ensure_rc=lambda ctx, name: STATE.classes.add(name),
)


class APIFixture(fixture.GabbiFixture):  # type: ignore[misc]
    """Placement's APIFixture without a database: a fresh graph and the
    environment variables the files read."""

    context: object = None

    def start_fixture(self) -> None:
        global STATE
        STATE = Recorded()
        for name in ("RP_UUID", "RP_NAME", "RP_UUID1", "RP_NAME1", "RP_UUID2", "RP_NAME2", "PROJECT_ID",
                     "ADMIN_PROJECT_ID", "SERVICE_PROJECT_ID", "USER_ID", "PROJECT_ID_ALT", "USER_ID_ALT",
                     "INSTANCE_UUID", "MIGRATION_UUID", "CONSUMER_UUID", "PARENT_PROVIDER_UUID",
                     "ALT_PARENT_PROVIDER_UUID"):
            os.environ[name] = str(uuid.uuid4())
        os.environ["CUSTOM_RES_CLASS"] = "CUSTOM_IRON_NFV"
        os.environ["CUSTOM_RES_CLASS1"] = "CUSTOM_IRON_NFV1"
        os.environ["CUSTOM_RES_CLASS2"] = "CUSTOM_IRON_NFV2"

    def stop_fixture(self) -> None:
        pass


def fixture_module() -> types.ModuleType:
    """Placement's fixture classes from SharedStorageFixture on, their code
    run over the recording helpers above."""
    source = (FUNCTIONAL / "fixtures/gabbits.py").read_text()
    body = source[source.index("class SharedStorageFixture(APIFixture):"):]
    module = types.ModuleType("hvfleet_candidates_gabbi_fixtures")
    module.__dict__.update(
        fixture=fixture, os=os, orc=os_resource_classes, ot=os_traits, uuids=_uuids,
        uuidutils=uuidutils, tb=_tb, rc_obj=types.SimpleNamespace(ResourceClass=_ResourceClass),
        APIFixture=APIFixture,
    )
    exec(compile(body, str(FUNCTIONAL / "fixtures/gabbits.py"), "exec"), module.__dict__)
    return module


# ---------------------------------------------------------------------------
# The stand-in edge


def _microversion(environ: dict[str, Any]) -> tuple[int, int]:
    header = environ.get("HTTP_OPENSTACK_API_VERSION", "")
    value = header.split("placement", 1)[-1].strip() if "placement" in header else ""
    if not value:
        return (1, 0)
    if value == "latest":
        return LATEST
    major, minor = value.split(".")
    return int(major), int(minor)


class CandidatesOnlyEdge:
    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        mv = _microversion(environ)
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        headers = [
            ("openstack-api-version", f"placement {mv[0]}.{mv[1]}"),
            ("vary", "openstack-api-version"),
        ]
        status, doc = self.route(method, path, environ, mv)
        if status == 200 and path == "/allocation_candidates" and mv >= (1, 15):
            headers += [("cache-control", "no-cache"), ("last-modified", "Wed, 02 Dec 2026 00:00:00 GMT")]
        body = json.dumps(doc).encode()
        headers.append(("content-type", "application/json"))
        reasons = {200: "OK", 400: "Bad Request", 404: "Not Found", 409: "Conflict"}
        start_response(f"{status} {reasons[status]}", headers)
        return [body]

    def route(
        self, method: str, path: str, environ: dict[str, Any], mv: tuple[int, int]
    ) -> tuple[int, Any]:
        if method == "GET" and path == "/allocation_candidates" and mv >= (1, 10):
            params: dict[str, list[str]] = {}
            for k, v in urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True):
                params.setdefault(k, []).append(v)
            known_traits = set(os_traits.get_traits()) | STATE.traits
            known_classes = set(os_resource_classes.STANDARDS) | STATE.classes
            try:
                query = parse_candidates_query(params, mv)
                answer = find_candidates(
                    STATE.graph(), query, resource_classes=known_classes, traits=known_traits
                )
            except PlacementBadRequest as e:
                return 400, _error(400, "Bad Request", e.detail, e.code)
            # The served text, held equal to json.dumps of the documented body.
            text = render_candidates_json(answer, mv)
            assert text == json.dumps(render_candidates(answer, mv))
            return 200, json.loads(text)
        if method == "GET" and path == "/traits":
            return 200, {"traits": sorted(set(os_traits.get_traits()) | STATE.traits)}
        parts = path.strip("/").split("/")
        if len(parts) >= 2 and parts[0] == "resource_providers" and parts[1] in STATE.providers:
            rp = STATE.providers[parts[1]]
            if method == "GET" and len(parts) == 2:
                return 200, {
                    "uuid": rp.uuid, "name": rp.name, "generation": rp.generation,
                    "parent_provider_uuid": rp.parent_provider_uuid,
                    "root_provider_uuid": STATE.root(rp.uuid),
                }
            if method == "PUT" and parts[2:] == ["aggregates"]:
                body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
                if body.get("resource_provider_generation") != rp.generation:
                    return 409, _error(409, "Conflict", "generation conflict", "placement.concurrent_update")
                rp.set_aggregates(body["aggregates"])
                return 200, {
                    "aggregates": sorted(rp.aggregates),
                    "resource_provider_generation": rp.generation,
                }
        return 404, _error(404, "Not Found", "The resource could not be found.", "placement.undefined_code")


def _error(status: int, title: str, message: str, code: str) -> dict[str, Any]:
    preamble = {
        400: "The server could not comply with the request since it is either malformed or "
        "otherwise incorrect.",
        404: "The resource could not be found.",
        409: "There was a conflict when trying to complete your request.",
    }[status]
    return {"errors": [{"status": status, "title": title, "detail": f"{preamble}\n\n {flat(message)}  ",
                        "code": code, "request_id": f"req-{uuid.uuid4()}"}]}


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class EdgeServer:
    """The stand-in edge on 127.0.0.1 in a thread."""

    def __enter__(self) -> EdgeServer:
        self.server: WSGIServer = make_server("127.0.0.1", 0, CandidatesOnlyEdge(), handler_class=_Quiet)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class FileResult:
    name: str
    steps: int
    candidate_steps: int
    passed: int
    candidate_passed: int
    failures: list[str] = field(default_factory=list)


def _is_candidates(test: unittest.TestCase) -> bool:
    spec = getattr(test, "test_data", {})
    url = spec.get("url", "") or ""
    return "allocation_candidates" in url


def _flatten(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _flatten(t)
        else:
            yield t


def _last_line(trace: str) -> str:
    lines = [x for x in trace.strip().splitlines() if x.strip() not in ("", "}", "]", "{")]
    return lines[-1][:300] if lines else trace[:300]


def run_file(name: str, port: int, fixtures: types.ModuleType) -> FileResult:
    path = GABBITS / name
    doc = yaml.safe_load(path.read_text())
    suite = suitemaker.test_suite_from_dict(
        unittest.TestLoader(), path.stem.replace("-", "_"), doc, str(path.parent), "127.0.0.1", port,
        fixtures, None, handlers=[h() for h in handlers.RESPONSE_HANDLERS],
    )
    cases = list(_flatten(suite))
    result = unittest.TestResult()
    suite.run(result)
    bad = {id(t) for t, _ in result.failures + result.errors} | {id(t) for t, _ in result.skipped}
    failures = [f"{t.id().rsplit('.', 1)[-1]}: {_last_line(e)}" for t, e in result.failures + result.errors]
    failures += [f"{t.id().rsplit('.', 1)[-1]}: skipped ({why})" for t, why in result.skipped]
    candidates = [t for t in cases if _is_candidates(t)]
    return FileResult(
        name, len(cases), len(candidates), len(cases) - len(bad & {id(t) for t in cases}),
        sum(1 for t in candidates if id(t) not in bad), failures,
    )


__all__ = ["FILES", "MAX_INT", "EdgeServer", "FileResult", "fixture_module", "run_file"]


# ---------------------------------------------------------------------------
# The same files through `hvfleet serve`: the recorded fixture seeded
# through hvfleet's Placement API, gabbi over HTTPS with an admin token.


def _api(port: int, token: str, method: str, path: str, body: Any = None, version: str = "1.39") -> Any:
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}/placement{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"x-auth-token": token, "OpenStack-API-Version": f"placement {version}",
                 "content-type": "application/json", "accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, context=ctx) as resp:
            text = resp.read()
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {path} {body}: {e.code} {e.read()[:600]!r}") from None
    return json.loads(text) if text else None


def seed(port: int, token: str, state: Recorded) -> None:
    """The recorded fixture as API calls, in the order a client makes them."""
    for rc in sorted(c for c in state.classes if c.startswith("CUSTOM_")):
        _api(port, token, "PUT", f"/resource_classes/{rc}", version="1.7")
    for t in sorted(t for t in state.traits if t.startswith("CUSTOM_")):
        _api(port, token, "PUT", f"/traits/{t}")
    for rp in state.providers.values():
        body: dict[str, Any] = {"name": rp.name, "uuid": rp.uuid}
        if rp.parent_provider_uuid is not None:
            body["parent_provider_uuid"] = rp.parent_provider_uuid
        gen = _api(port, token, "POST", "/resource_providers", body)["generation"]
        if rp.inventories:
            invs = {rc: {"total": i.total, "reserved": i.reserved, "min_unit": i.min_unit,
                         "max_unit": i.max_unit, "step_size": i.step_size,
                         "allocation_ratio": i.allocation_ratio} for rc, i in rp.inventories.items()}
            gen = _api(port, token, "PUT", f"/resource_providers/{rp.uuid}/inventories",
                       {"resource_provider_generation": gen, "inventories": invs})[
                "resource_provider_generation"]
        if rp.traits:
            gen = _api(port, token, "PUT", f"/resource_providers/{rp.uuid}/traits",
                       {"resource_provider_generation": gen, "traits": sorted(rp.traits)})[
                "resource_provider_generation"]
        if rp.aggregates:
            _api(port, token, "PUT", f"/resource_providers/{rp.uuid}/aggregates",
                 {"resource_provider_generation": gen, "aggregates": sorted(rp.aggregates)})
    for consumer, per_rp in state.allocations.items():
        _api(port, token, "PUT", f"/allocations/{consumer}", {
            "allocations": {rp: {"resources": res} for rp, res in per_rp.items()},
            "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()), "consumer_generation": None,
            "consumer_type": "INSTANCE",
        })


def served_fixture_module(port: int, token: str, reset: Callable[[], None]) -> types.ModuleType:
    recorded = fixture_module()
    module = types.ModuleType("hvfleet_candidates_gabbi_served_fixtures")
    for name, cls in vars(recorded).items():
        if not (isinstance(cls, type) and issubclass(cls, fixture.GabbiFixture)) or cls is APIFixture:
            continue

        def start(self: Any, _cls: type = cls) -> None:
            reset()
            _cls.start_fixture(self)  # type: ignore[attr-defined]
            seed(port, token, STATE)

        setattr(module, name, type(name, (cls,), {"start_fixture": start}))
    return module


def run_file_served(
    name: str, port: int, suite_doc: dict[str, Any], fixtures: types.ModuleType
) -> FileResult:
    path = GABBITS / name
    suite = suitemaker.test_suite_from_dict(
        unittest.TestLoader(), path.stem.replace("-", "_"), suite_doc, str(path.parent), "127.0.0.1", port,
        fixtures, None, prefix="/placement", handlers=[h() for h in handlers.RESPONSE_HANDLERS],
    )
    cases = list(_flatten(suite))
    result = unittest.TestResult()
    suite.run(result)
    bad = {id(t) for t, _ in result.failures + result.errors} | {id(t) for t, _ in result.skipped}
    failures = [f"{t.test_data.get('name')}: {_last_line(e)}" for t, e in result.failures + result.errors]
    failures += [f"{t.test_data.get('name')}: skipped ({why})" for t, why in result.skipped]
    candidates = [t for t in cases if _is_candidates(t)]
    return FileResult(
        name, len(cases), len(candidates), len(cases) - len(bad & {id(t) for t in cases}),
        sum(1 for t in candidates if id(t) not in bad), failures,
    )
