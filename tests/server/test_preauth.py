"""Nothing before authentication costs more than a few milliseconds, against the
real `hvfleet serve` over HTTPS with real tokens: bodies are read only for a
known caller, YAML aliases and deep nesting are refused, query integers are
bounded, continue tokens serve only the list
that issued them, a revoked token's watch ends, and the files are owner-only."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.token import split_token
from hvfleet.server.identity import Identity
from hvfleet.store import open_store
from hvfleet.store.tokens import revoke_token
from tests.support.documents import alias_bomb, nested
from tests.support.serve import Server, reset_fleet

GV = "/apis/hvfleet.io/v1"
APPLY = "application/apply-patch+yaml"


@pytest.fixture(scope="module")
def server(server: Server) -> Server:
    """The session's server (tests/conftest.py) with hv1, hv2 and hv3."""
    with open_store(server.store_url) as s:
        reset_fleet(s)
        s.create(Hypervisor(metadata=ObjectMeta(name="hv3")), "test-setup")
    return server


def timed(call: Any) -> tuple[float, Any]:
    t0 = time.monotonic()
    out = call()
    return time.monotonic() - t0, out


# -- the alias bomb and reading before authentication --------------------------------------------

def test_an_anonymous_alias_bomb_is_refused_at_once_while_healthz_answers(server: Server) -> None:
    bomb = alias_bomb()
    assert len(bomb.encode()) < 500
    results: dict[str, tuple[float, int]] = {}

    def send(key: str, token: str | None) -> None:
        s = server.session(token)
        s.get(server.url + "/healthz", timeout=10)  # TLS set up before the clock starts
        took, r = timed(lambda: s.patch(f"{server.url}{GV}/hypervisors/hv1", data=bomb,
                                        headers={"Content-Type": APPLY}, timeout=10))
        results[key] = (took, r.status_code)

    probe = server.session(None)
    probe.get(server.url + "/healthz", timeout=10)
    threads = [threading.Thread(target=send, args=(f"anonymous-{i}", None)) for i in range(3)]
    threads.append(threading.Thread(target=send, args=("operator", server.tokens["operator"])))
    for t in threads:
        t.start()
    healthz = [timed(lambda: probe.get(server.url + "/healthz", timeout=10)) for _ in range(5)]
    for t in threads:
        t.join(15)
    assert all(r.status_code == 200 and took < 0.5 for took, r in healthz), healthz
    for i in range(3):
        took, code = results[f"anonymous-{i}"]
        assert code == 401 and took < 0.5, results
    took, code = results["operator"]
    assert code == 400 and took < 0.5, results  # a known caller's bomb: refused at its first anchor


def test_an_authenticated_alias_is_a_400_naming_it_and_nothing_is_written(server: Server) -> None:
    s = server.session(server.tokens["operator"])
    before = s.get(f"{server.url}{GV}/hypervisors/hv2").json()["metadata"]["resourceVersion"]
    body = ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata:\n  name: hv2\n  labels: &l {a: b}\n"
            "  annotations: *l\n")
    r = s.patch(f"{server.url}{GV}/hypervisors/hv2", data=body, headers={"Content-Type": APPLY})
    assert r.status_code == 400, r.text
    assert r.json()["reason"] == "BadRequest"
    assert "found anchor &l" in r.json()["message"] and "line 5" in r.json()["message"]
    after = s.get(f"{server.url}{GV}/hypervisors/hv2").json()["metadata"]["resourceVersion"]
    assert after == before


ROUTES = [
    ("POST", f"{GV}/hypervisors", "application/json"),
    ("PUT", f"{GV}/hypervisors/hv1", "application/json"),
    ("PUT", f"{GV}/hypervisors/hv1/status", "application/json"),
    ("PATCH", f"{GV}/hypervisors/hv1", APPLY),
    ("PATCH", f"{GV}/hypervisors/hv1", "application/merge-patch+json"),
    ("PATCH", f"{GV}/hypervisors/hv1/status", "application/json-patch+json"),
    ("DELETE", f"{GV}/hypervisors/hv1", "application/json"),
    ("POST", f"{GV}/reservations/r1/release", "application/json"),
    ("POST", f"{GV}/fit", "application/json"),
    ("POST", f"{GV}/placement", "application/json"),
    ("POST", f"{GV}/cpubaseline", "application/json"),
    ("POST", f"{GV}/guests/generate", "application/json"),
    ("POST", f"{GV}/guests/check", "application/json"),
    ("POST", f"{GV}/batch", "application/json"),
    ("POST", f"{GV}/accesstokens", "application/json"),
    ("PUT", f"{GV}/accesstokens/0123456789abcdef", "application/json"),
]


@pytest.mark.parametrize("method, path, media", ROUTES)
def test_no_route_reads_a_body_before_it_knows_the_caller(server: Server, method: str, path: str,
                                                          media: str) -> None:
    """An anonymous caller's body is never decoded: 401, whatever the body is
    (a malformed one would be a 400, a bomb a stall)."""
    s = server.session(None)
    for body in (alias_bomb(), "{" * 10):
        r = s.request(method, server.url + path, data=body, headers={"Content-Type": media}, timeout=10)
        assert r.status_code == 401, (body[:10], r.text)
        assert r.json()["reason"] == "Unauthorized"


@pytest.mark.parametrize("depth", [101, 1_000, 200_000])
def test_deeply_nested_json_is_a_400_not_a_500(server: Server, depth: int) -> None:
    s = server.session(server.tokens["operator"])
    doc = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
           "metadata": {"name": "deep", "annotations": {"x": "y"}}, "spec": {"x": "PLACEHOLDER"}}
    text = json.dumps(doc).replace('"PLACEHOLDER"', "[" * depth + "]" * depth)
    for r in (s.post(f"{server.url}{GV}/hypervisors", data=text,
                     headers={"Content-Type": "application/json"}),
              s.patch(f"{server.url}{GV}/hypervisors/hv2", text.replace('"deep"', '"hv2"'),
                      headers={"Content-Type": "application/merge-patch+json"}),
              s.patch(f"{server.url}{GV}/hypervisors/hv2", text.replace('"deep"', '"hv2"'),
                      headers={"Content-Type": APPLY})):
        assert r.status_code == 400, r.text[:300]
        assert "levels deep" in r.json()["message"]
    assert s.get(f"{server.url}{GV}/hypervisors/deep").status_code == 404


def test_a_json_patch_nested_deeply_is_a_400(server: Server) -> None:
    s = server.session(server.tokens["operator"])
    ops = json.dumps([{"op": "add", "path": "/metadata/annotations/x", "value": nested(500)}])
    r = s.patch(f"{server.url}{GV}/hypervisors/hv2", ops,
                headers={"Content-Type": "application/json-patch+json"})
    assert r.status_code == 400 and "levels deep" in r.json()["message"], r.text[:300]


# -- query integers -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, value, extra", [
    ("limit", "9" * 5000, {}),
    ("limit", "1" + "0" * 18, {}),
    ("limit", "²", {}),
    ("timeoutSeconds", "9" * 5000, {"watch": "true"}),
    ("timeoutSeconds", "-1", {"watch": "true"}),
    ("resourceVersion", "9" * 5000, {"watch": "true"}),
])
def test_overlong_or_odd_query_integers_are_a_400_naming_the_parameter(
        server: Server, name: str, value: str, extra: dict[str, str]) -> None:
    s = server.session(server.tokens["viewer"])
    r = s.get(f"{server.url}{GV}/hypervisors", params={name: value, **extra}, timeout=10)
    assert r.status_code == 400, r.text[:300]
    status = r.json()
    assert status["reason"] == "BadRequest" and status["message"].startswith(f"{name}: ")
    assert status["details"]["causes"][0]["field"] == name
    assert len(status["message"]) < 200  # the value is shortened, not echoed whole


# -- continue tokens ----------------------------------------------------------------------------

def _pages(s: requests.Session, url: str, **params: str) -> list[str]:
    names: list[str] = []
    token = ""
    while True:
        r = s.get(url, params={**params, **({"continue": token} if token else {})})
        assert r.status_code == 200, r.text
        names += [o["metadata"]["name"] for o in r.json()["items"]]
        token = r.json()["metadata"].get("continue", "")
        if not token:
            return names


def test_continue_tokens_serve_only_the_caller_kind_and_selector_that_got_them(server: Server) -> None:
    url = f"{server.url}{GV}/hypervisors"
    admin = server.session(server.tokens["admin"])
    assert _pages(admin, url, limit="1") == ["hv1", "hv2", "hv3"]
    first = admin.get(url, params={"limit": "1"}).json()["metadata"]["continue"]

    agent = server.session(server.tokens["agent"])  # bound to hv1
    own = {"fieldSelector": "metadata.name=hv1"}
    r = agent.get(url, params={**own, "limit": "1", "continue": first})
    assert r.status_code == 400 and "issued for another list" in r.json()["message"], r.text
    # Another kind, another selector: refused too, for the caller that got it.
    r = admin.get(f"{server.url}{GV}/reservations", params={"limit": "1", "continue": first})
    assert r.status_code == 400 and "issued for another list" in r.json()["message"]
    r = admin.get(url, params={"limit": "1", "labelSelector": "a=b", "continue": first})
    assert r.status_code == 400
    # A token forged with the agent's own binding around the admin's snapshot.
    from hvfleet.server.resources import list_binding

    data = json.loads(base64.urlsafe_b64decode(first))
    token_id, _ = split_token(server.tokens["agent"])
    data["for"] = list_binding(Identity("agent/hv1", "agent", "hv1", token_id), "Hypervisor",
                               "", own["fieldSelector"])
    forged = base64.urlsafe_b64encode(json.dumps(data).encode()).decode()
    r = agent.get(url, params={**own, "limit": "1", "continue": forged})
    assert r.status_code == 400, r.text
    assert "hv2" not in r.text and "hv3" not in r.text
    # The admin's own pages still work.
    second = admin.get(url, params={"limit": "1", "continue": first})
    assert [o["metadata"]["name"] for o in second.json()["items"]] == ["hv2"]


# -- streams end with their token ------------------------------------------------------------------

def _watch_until_end(s: requests.Session, url: str, started: threading.Event,
                     lines: list[dict[str, Any]], ended: list[float]) -> None:
    with s.get(url, params={"watch": "true", "timeoutSeconds": "120"}, stream=True, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append(json.loads(line))
                started.set()
    ended.append(time.monotonic())


@pytest.mark.parametrize("how", ["revoked", "expired"])
def test_a_revoked_or_expired_token_ends_its_open_watch_within_seconds(server: Server, how: str) -> None:
    ttl = timedelta(seconds=4) if how == "expired" else timedelta(hours=1)
    token = server.token("viewer", name=f"watcher-{how}", ttl=ttl)
    lines: list[dict[str, Any]] = []
    ended: list[float] = []
    started = threading.Event()
    t = threading.Thread(target=_watch_until_end,
                         args=(server.session(token), f"{server.url}{GV}/hypervisors", started, lines, ended),
                         daemon=True)
    t.start()
    assert started.wait(10), "the watch sent nothing"
    if how == "revoked":
        with open_store(server.store_url) as s:  # as on another replica: no cache is told
            revoke_token(s, split_token(token)[0], "test-setup")
        gone_at = time.monotonic()
    else:
        gone_at = time.monotonic() + max(0.0, 4 - 1)  # the token was issued ~1 s before
    t.join(20)
    assert ended, "the watch kept streaming after its token stopped working"
    assert ended[0] - gone_at < 6
    assert lines[-1]["type"] == "ERROR" and lines[-1]["object"]["code"] == 401, lines[-1]


# -- connections and files ---------------------------------------------------------------------------

def test_the_database_its_wal_and_the_data_dir_are_owner_only(server: Server) -> None:
    db = Path(server.store_url.removeprefix("sqlite:///"))
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        assert path.exists(), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path, oct(path.stat().st_mode))
    assert stat.S_IMODE(server.data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(server.audit_log.stat().st_mode) == 0o600


def test_an_existing_audit_log_is_tightened_to_owner_only(tmp_path: Path) -> None:
    from hvfleet.server.audit import configure_audit_log

    log = tmp_path / "audit.log"
    log.write_text('{"old": "line"}\n')
    os.chmod(log, 0o644)
    handler = configure_audit_log(str(log))
    try:
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert log.read_text() == '{"old": "line"}\n'  # appended to, not replaced
    finally:
        handler.close()


def test_a_new_sqlite_store_is_created_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        with open_store(f"sqlite:///{tmp_path}/fresh.db") as s:
            s.create(Hypervisor(metadata=ObjectMeta(name="hv1")), "test-setup")
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    finally:
        os.umask(old)
    assert modes == {"fresh.db": 0o600, "fresh.db-wal": 0o600, "fresh.db-shm": 0o600}

