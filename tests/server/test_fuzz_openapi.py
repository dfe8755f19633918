"""Schemathesis over the OpenAPI document the running server publishes.

A real `hvfleet serve` (the session's process, tests/conftest.py: uvicorn, TLS
with the CA it makes, a SQLite store) with real admin and operator tokens.
Every operation of /openapi/v3/apis/hvfleet.io/v1 is called with requests that
follow the schema (positive) and requests that break it (negative), some on
the names of objects that exist. Each answer must not be a 5xx, each error must
be a meta/v1 Status with the answer's code, a body that breaks the published
schema must not be accepted, and after the run every stored object must still
validate against the model and against the CRD schema from `hvfleet crd`.
Bounded by max_examples and a wall-clock budget so it stays inside `make test`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from hvfleet.model import Hypervisor
from hvfleet.model.crd import crds
from hvfleet.model.hypervisor import KINDS
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from tests.support.serve import Server

KNOWN = {"hypervisors": ["fz-1", "fz-2"], "reservations": ["fz-r1"], "leases": ["fz-1"],
         "overcommitpolicies": ["fz-p1"]}
EXAMPLES = int(os.environ.get("HVFLEET_FUZZ_EXAMPLES", "300"))  # about 20 s on this machine


@schemathesis.serializer("application/apply-patch+yaml")
def _apply_yaml(ctx: Any, value: Any) -> bytes:
    return yaml.safe_dump(value).encode()


@dataclass
class Served:
    url: str
    ca: Path
    store_url: str
    tokens: dict[str, str]
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def served(server: Server) -> Served:
    """The session's server (tests/conftest.py, its store emptied for this module)
    with the hypervisors the fuzzer names."""
    with open_store(server.store_url) as store:
        for name in KNOWN["hypervisors"]:
            store.create(Hypervisor.model_validate({"metadata": {"name": name}}), agent_manager(name))
    return Served(server.url, server.ca, server.store_url, server.tokens, server.process)


def _published(s: Served) -> dict[str, Any]:
    h = {"Authorization": f"Bearer {s.tokens['operator']}"}
    root = requests.get(s.url + "/openapi/v3", headers=h, verify=str(s.ca), timeout=30).json()
    rel = root["paths"]["apis/hvfleet.io/v1"]["serverRelativeURL"]
    doc: dict[str, Any] = requests.get(s.url + rel, headers=h, verify=str(s.ca), timeout=30).json()
    return doc


def _body_schema(doc: dict[str, Any], case: Any) -> dict[str, Any] | None:
    """The published schema of this case's request body, refs resolvable."""
    op = doc["paths"][case.operation.path][case.method.lower()]
    content = op.get("requestBody", {}).get("content", {})
    schema = content.get(case.media_type or "application/json", {}).get("schema")
    if schema is None:
        return None
    return {**schema, "components": doc["components"]}


def _breaks_schema(schema: dict[str, Any], body: Any) -> bool:
    try:
        jsonschema.validate(body, schema)
    except jsonschema.ValidationError:
        return True
    return False


def _crd_schemas() -> dict[str, dict[str, Any]]:
    return {c["spec"]["names"]["kind"]: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            for c in crds()}


def _plural(path: str) -> str:
    return path.split("/")[4]


def test_fuzz_openapi_no_5xx_and_no_invalid_object_stored(served: Served) -> None:
    doc = _published(served)
    schema = schemathesis.openapi.from_dict(doc)
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 20, [f"{o.method} {o.path}" for o in ops]
    session = requests.Session()
    start = time.monotonic()
    calls: dict[str, int] = {}
    seen_codes: set[int] = set()

    @given(data=st.data())
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(data: st.DataObject) -> None:
        op = data.draw(st.sampled_from(ops), label="operation")
        mode = data.draw(st.sampled_from(list(GenerationMode)), label="mode")
        fixed = None
        if "{name}" in op.path and data.draw(st.booleans(), label="known name"):
            fixed = {"name": data.draw(st.sampled_from(KNOWN.get(_plural(op.path), ["fz-1"])), label="name")}
        case = data.draw(op.as_strategy(mode, path_parameters=fixed), label="case")
        body = case.body
        if isinstance(body, dict) and isinstance(body.get("metadata"), dict) \
                and data.draw(st.booleans(), label="valid name"):
            # A random name is mostly refused first; a valid one lets the rest be judged.
            body["metadata"]["name"] = (fixed or {}).get("name") or data.draw(
                st.sampled_from(["fz-1", "fz-3", "fz-r1", "fz-r2", "fz-p1"]), label="body name")
        if case.query and "watch" in case.query:
            case.query["timeoutSeconds"] = 1  # a watch that is served streams until then
        role = data.draw(st.sampled_from(["admin", "operator"]), label="role")
        resp = case.call(base_url=served.url, session=session, verify=str(served.ca), timeout=30,
                         headers={**(case.headers or {}),
                                  "Authorization": f"Bearer {served.tokens[role]}"})
        calls[f"{case.method} {case.operation.path}"] = calls.get(
            f"{case.method} {case.operation.path}", 0) + 1
        seen_codes.add(resp.status_code)
        where = f"{case.method} {case.formatted_path} ({mode.value}, {role}): {resp.status_code}"
        assert resp.status_code < 500, f"{where}\n{resp.text[:2000]}\n{case.as_curl_command()}"
        if resp.status_code >= 400:
            body = resp.json()
            assert body.get("kind") == "Status" and body.get("code") == resp.status_code, \
                f"{where}: {resp.text[:500]}"
            return
        if case.method in ("POST", "PUT") and case.body is not None:
            body_schema = _body_schema(doc, case)
            if body_schema is not None:
                assert not _breaks_schema(body_schema, case.body), \
                    f"{where}: accepted a body the published schema refuses\n{json.dumps(case.body)[:1000]}"

    fuzz()
    print(f"{sum(calls.values())} calls in {time.monotonic() - start:.1f}s, codes {sorted(seen_codes)}")
    assert sum(calls.values()) >= 50, calls
    assert any(c < 300 for c in seen_codes), seen_codes  # the fuzz reached real writes/reads

    # Every stored object, as the store decodes it and as the API serves it,
    # is a valid object: the model's and the CRD's schema both accept it.
    crd = _crd_schemas()
    h = {"Authorization": f"Bearer {served.tokens['admin']}"}
    with open_store(served.store_url) as store:
        for kind, model in KINDS.items():
            for obj in store.list(kind).items:
                wire = obj.model_dump(by_alias=True, mode="json", exclude_none=True)
                model.model_validate(wire)
                jsonschema.validate(wire, crd[kind])
    for plural in KNOWN:
        listed = requests.get(f"{served.url}/apis/hvfleet.io/v1/{plural}", headers=h,
                              verify=str(served.ca), timeout=30)
        assert listed.status_code == 200, listed.text
        for item in listed.json()["items"]:
            model = KINDS[item["kind"]]
            model.model_validate(item)
            jsonschema.validate(item, crd[item["kind"]])
