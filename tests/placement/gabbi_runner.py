"""Placement 16.0's own gabbi API tests, run against `hvfleet serve`.

The YAML files are read from the installed openstack-placement wheel and run
unchanged but for the token header (`x-auth-token: admin` becomes an hvfleet
admin token, `user` a token of role agent bound to a host that has no
provider: Placement's defaults let such a user do nothing) and TLS (gabbi
reaches the server over HTTPS; it does not verify the self-signed
certificate). `APIFixture` is ours: it empties the Placement records of the
store (a fresh store per file, on one server) and sets the environment
variables the files read, as Placement's does."""

from __future__ import annotations

import http.client
import os
import ssl
import types
import unittest
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from gabbi import fixture, handlers, suitemaker

import placement
from hvfleet.store.base import Store
from hvfleet.store.tokens import issue_token

GABBITS = Path(placement.__file__).parent / "tests/functional/gabbits"
PLACEMENT_KINDS = ("ResourceProvider", "PlacementConsumer", "PlacementName")


def plain_api_files() -> list[Path]:
    """The files whose only fixture is APIFixture."""
    out = []
    for path in sorted(GABBITS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("fixtures") == ["APIFixture"]:
            out.append(path)
    return out


def issue_tokens(store: Store) -> Tokens:
    now = datetime.now(UTC)
    _, admin = issue_token(store, "admin", manager="test", now=now, ttl=None, name="gabbi-admin")
    _, user = issue_token(store, "agent", manager="test", now=now, ttl=None, hypervisor="gabbi-user")
    return Tokens(admin, user)


def reset(store: Store) -> None:
    for kind in PLACEMENT_KINDS:
        for obj in store.list(kind).items:
            store.delete(kind, obj.metadata.name)


def _env() -> None:
    for name in ("RP_UUID", "RP_NAME", "RP_UUID1", "RP_NAME1", "RP_UUID2", "RP_NAME2", "PROJECT_ID",
                 "ADMIN_PROJECT_ID", "SERVICE_PROJECT_ID", "USER_ID", "PROJECT_ID_ALT", "USER_ID_ALT",
                 "INSTANCE_UUID", "MIGRATION_UUID", "CONSUMER_UUID", "PARENT_PROVIDER_UUID",
                 "ALT_PARENT_PROVIDER_UUID"):
        os.environ[name] = str(uuid.uuid4())
    os.environ["CUSTOM_RES_CLASS"] = "CUSTOM_IRON_NFV"
    os.environ["CUSTOM_RES_CLASS1"] = "CUSTOM_IRON_NFV1"
    os.environ["CUSTOM_RES_CLASS2"] = "CUSTOM_IRON_NFV2"


def fixture_module(store: Store) -> types.ModuleType:
    class APIFixture(fixture.GabbiFixture):  # type: ignore[misc]
        def start_fixture(self) -> None:
            reset(store)
            _env()

        def stop_fixture(self) -> None:
            pass

    module = types.ModuleType("hvfleet_gabbi_fixtures")
    module.APIFixture = APIFixture  # type: ignore[attr-defined]
    return module


@dataclass(frozen=True)
class Tokens:
    admin: str
    user: str

    def of(self, name: str) -> str:
        return self.user if name == "user" else self.admin


def _with_token(headers: dict[str, Any] | None, tokens: Tokens) -> dict[str, Any] | None:
    if headers is None:
        return None
    return {k: (tokens.of(v) if k.lower() == "x-auth-token" else v) for k, v in headers.items()}


def suite_dict(path: Path, token: Tokens) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    defaults = doc.setdefault("defaults", {})
    defaults["request_headers"] = _with_token(defaults.get("request_headers"), token)
    defaults["ssl"] = True
    defaults["cert_validate"] = False
    for test in doc.get("tests", []):
        if "request_headers" in test:
            test["request_headers"] = _with_token(test["request_headers"], token)
    return doc


@dataclass
class FileResult:
    name: str
    steps: int
    passed: int
    failures: list[str] = field(default_factory=list)


def _steps(suite: unittest.TestSuite) -> list[Any]:
    out: list[Any] = []
    for item in suite:
        out.extend(_steps(item) if isinstance(item, unittest.TestSuite) else [item])
    return out


def _step(test: Any) -> str:
    return str(getattr(test, "test_data", {}).get("name", test.id()))


def _why(trace: str) -> str:
    """The assertion of a failure trace (gabbi appends the response body after it)."""
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith(("AssertionError", "gabbi.", "httpx.", "ValueError", "KeyError")):
            return " ".join(lines[i:i + 3])[:400]
    return lines[-1][:400] if lines else ""


class AsAsked:
    """gabbi's HTTP client for one step, except for a request httpx will not
    send as the step asks: a Content-Length that is not a number (httpx
    refuses it). That one goes over http.client on a TLS connection of its
    own, with the step's method, path, headers and body exactly as given
    (http.client sends any header value without a line break), and its
    answer is handed to gabbi in the form gabbi's client gives it."""

    def __init__(self, http: Any, cert_validate: bool) -> None:
        self.http = http
        self.cert_validate = cert_validate

    def request(self, absolute_uri: str, method: str, body: Any, headers: dict[str, str],
                redirect: bool, timeout: float) -> tuple[httpx.Headers, bytes]:
        lengths = [v for k, v in headers.items() if k.lower() == "content-length"]
        if all(str(v).isdigit() for v in lengths):
            return self.http.request(absolute_uri, method, body, headers, redirect, timeout)  # type: ignore[no-any-return]
        url = urllib.parse.urlsplit(absolute_uri)
        context = ssl.create_default_context() if self.cert_validate else ssl._create_unverified_context()
        conn = http.client.HTTPSConnection(url.hostname or "", url.port, timeout=timeout, context=context)
        try:
            conn.putrequest(method, url.path + (f"?{url.query}" if url.query else ""),
                            skip_host="host" in {k.lower() for k in headers}, skip_accept_encoding=True)
            for name, value in headers.items():
                conn.putheader(name, str(value))
            conn.endheaders(body.encode() if isinstance(body, str) else body)
            answer = conn.getresponse()
            content = answer.read()
            out = httpx.Headers(answer.getheaders())
            out["status"], out["reason"] = str(answer.status), answer.reason
            out["http_protocol_version"] = "HTTP/1.1"
            return out, content
        finally:
            conn.close()


def run_file(path: Path, host: str, port: int, token: Tokens, store: Store,
             prefix: str = "/placement") -> FileResult:
    """Every step of one file against the Placement API at `prefix` (`` for
    the root of --placement-listen's listener)."""
    loader = unittest.TestLoader()
    suite = suitemaker.test_suite_from_dict(
        loader, path.stem.replace("-", "_"), suite_dict(path, token), str(path.parent), host, port,
        fixture_module(store), None, prefix=prefix,
        handlers=[h() for h in handlers.RESPONSE_HANDLERS])
    for test in _steps(suite):
        cls = type(test)
        cls.http = AsAsked(cls.http, bool(cls.test_data.get("cert_validate", True)))
    result = unittest.TestResult()
    suite.run(result)
    failed = [(t, e) for t, e in result.failures + result.errors]
    names = [f"{_step(t)}: {_why(e)}" for t, e in failed]
    names += [f"{_step(t)}: skipped ({why})" for t, why in result.skipped]
    steps = result.testsRun
    return FileResult(path.name, steps, steps - len(failed) - len(result.skipped), names)
