"""Least privilege where the write is accepted (issue 16 §5), against a real
`hvfleet serve` over HTTPS with real tokens:

- an agent whose Hypervisor an operator deleted may bring it back only bare
  (name and status), never with labels, annotations or spec of its choosing,
  and the real agent still registers itself that way;
- one subject speaks for one role on every path that writes an AccessToken:
  an issued token, a raw record an admin posts (what a remote Store does), a
  record an admin replaces, and two admins racing."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.errors import Forbidden, InvalidInput
from hvfleet.model.token import (
    AccessToken,
    AccessTokenSpec,
    Role,
    check_token_update,
    hash_secret,
    new_secret,
    role_conflict,
    token_text,
)
from hvfleet.server.auth import RoleAuthorizer, not_bare
from hvfleet.server.identity import Action, Identity
from hvfleet.store import Store, open_store
from hvfleet.store.tokens import list_tokens
from tests.support.serve import GV, HVFLEET, Server

NODE = Path(__file__).resolve().parents[2] / "examples" / "fleet" / "compute-01.xml"
HOST = "compute-01"



@pytest.fixture
def store(server: Server) -> Iterator[Store]:
    with open_store(server.store_url) as s:
        yield s


def _operator_made(store: Store, name: str) -> None:
    """An operator's host: labels that pick an OvercommitPolicy, and a ratio."""
    if not _absent(store, name):
        store.delete("Hypervisor", name)  # what an earlier, failed test left
    store.create(Hypervisor.model_validate({
        "metadata": {"name": name, "labels": {"role": "gpu"}, "annotations": {"owner": "ops"}},
        "spec": {"overcommit": {"cpu": 4}}}), "operator")


def _absent(store: Store, name: str) -> bool:
    return name not in {h.name for h in store.list_hypervisors()}


def _hv(name: str, **more: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": name}}
    for key, value in more.items():
        if key == "spec":
            doc["spec"] = value
        else:
            doc["metadata"][key] = value
    return doc


# -- an agent recreates its hypervisor only bare --------------------------------------------------

@pytest.mark.parametrize(
    ("body", "named"),
    [
        (_hv("hv5", labels={"role": "gpu"}), "metadata.labels"),
        (_hv("hv5", annotations={"note": "mine"}), "metadata.annotations"),
        (_hv("hv5", spec={"overcommit": {"cpu": 16}}), "spec"),
        (_hv("hv5", labels={"role": "gpu"}, spec={"extraCapacity": {"VGPU": 8}}), "metadata.labels, spec"),
    ],
)
@pytest.mark.parametrize("how", ["create", "apply"])
def test_an_agent_cannot_recreate_its_deleted_hypervisor_with_its_own_labels_or_spec(
    server: Server, store: Store, body: dict[str, Any], named: str, how: str
) -> None:
    _operator_made(store, "hv5")
    store.delete("Hypervisor", "hv5")
    agent = server.session(server.token("agent", hypervisor="hv5"))
    base = server.url + f"{GV}/hypervisors"
    if how == "create":
        r = agent.post(base, json=body, timeout=30)
    else:
        r = agent.patch(f"{base}/hv5", params={"fieldManager": "agent/hv5"}, data=json.dumps(body),
                        headers={"Content-Type": "application/apply-patch+yaml"}, timeout=30)
    assert r.status_code == 403, r.text
    assert r.json()["reason"] == "Forbidden"
    if how == "create":
        assert r.json()["message"].endswith(
            f"role agent creates only a bare object (name and status); {named} are set by an operator")
    # (An agent may not patch its Hypervisor at all, so an apply is refused before.)
    assert _absent(store, "hv5")  # nothing written


def test_an_agent_may_recreate_its_hypervisor_bare_and_only_its_own(server: Server, store: Store) -> None:
    _operator_made(store, "hv6")
    store.delete("Hypervisor", "hv6")
    agent = server.session(server.token("agent", hypervisor="hv6"))
    base = server.url + f"{GV}/hypervisors"
    assert agent.post(base, json=_hv("hv7"), timeout=30).status_code == 403  # not its own
    r = agent.post(base, json={**_hv("hv6"), "status": {"capacity": {"cpu": 8}}}, timeout=30)
    assert r.status_code == 201, r.text
    back = store.get_hypervisor("hv6")
    assert (back.metadata.labels, back.metadata.annotations, back.spec.overcommit) == ({}, {}, {})
    assert back.status.capacity == {"cpu": 8}
    store.delete("Hypervisor", "hv6")


def test_the_real_agent_registers_itself_bare_again_after_a_delete(
    server: Server, store: Store, tmp_path: Path
) -> None:
    """The agent's own registration (status_writer: create bare, then status) is
    what the rule allows, on first start and after an operator's delete."""
    token = server.token("agent", hypervisor=HOST)
    env = {k: v for k, v in os.environ.items() if k not in ("HVFLEET_TOKEN", "HVFLEET_CA", "KUBECONFIG")}
    env["HOME"] = str(tmp_path)

    def agent_once() -> None:
        r = subprocess.run([HVFLEET, "agent", "--connect", f"test://{NODE}", "--store", server.url,
                            "--token", token, "--ca", str(server.ca), "--once"],
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr

    agent_once()  # first start
    assert store.get_hypervisor(HOST).status.capacity
    store.delete("Hypervisor", HOST)
    _operator_made(store, HOST)
    store.delete("Hypervisor", HOST)
    agent_once()  # after the delete
    back = store.get_hypervisor(HOST)
    assert back.status.capacity and back.metadata.labels == {} and back.spec.overcommit == {}
    assert {e.manager for e in back.metadata.managed_fields} == {f"agent/{HOST}"}
    store.delete("Hypervisor", HOST)


# -- one subject, one role, on every path --------------------------------------------------------

def _record(subject: str, role: Role) -> tuple[AccessToken, str]:
    token_id, secret = new_secret()
    record = AccessToken(metadata=ObjectMeta(name=token_id),
                         spec=AccessTokenSpec(subject=subject, role=role, secret_sha256=hash_secret(secret)))
    return record, token_text(token_id, secret)


def _live_roles(store: Store, subject: str) -> set[str]:
    return {t.spec.role for t in list_tokens(store) if t.spec.subject == subject and not t.spec.revoked}


def test_a_raw_token_record_cannot_give_a_subject_a_second_role(server: Server, store: Store) -> None:
    admin = server.session(server.tokens["admin"])
    base = server.url + f"{GV}/accesstokens"
    r = admin.post(base, json={"role": "scheduler", "name": "nova-raw"}, timeout=30)
    assert r.status_code == 201, r.text
    before = {t.name for t in list_tokens(store)}
    record, text = _record("nova-raw", "operator")
    r = admin.post(base, json=record.to_dict(), timeout=30)
    assert r.status_code == 422, r.text
    status = r.json()
    assert status["reason"] == "Invalid"
    assert [c["field"] for c in status["details"]["causes"]] == ["spec.subject"]
    assert "'nova-raw' is already the subject of scheduler token" in status["message"]
    assert "one name speaks for one role" in status["message"]
    assert {t.name for t in list_tokens(store)} == before  # nothing written
    assert server.session(text).get(server.url + f"{GV}/hypervisors", timeout=30).status_code == 401
    # The same role may hold several tokens under one name (rotation).
    same, _ = _record("nova-raw", "scheduler")
    assert admin.post(base, json=same.to_dict(), timeout=30).status_code == 201
    assert _live_roles(store, "nova-raw") == {"scheduler"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"role": "operator"}, "spec.role"),
        ({"role": "admin"}, "spec.role"),
        ({"subject": "someone-else"}, "spec.subject"),
    ],
)
@pytest.mark.parametrize("force", [False, True])
def test_replacing_a_token_record_never_changes_who_it_speaks_for(
    server: Server, store: Store, change: dict[str, str], field: str, force: bool
) -> None:
    admin = server.session(server.tokens["admin"])
    base = server.url + f"{GV}/accesstokens"
    subject = f"dash-{field.split('.')[1]}-{change.get('role', 'x')}-{force}"
    stored = admin.post(base, json={"role": "viewer", "name": subject}, timeout=30).json()
    stored.pop("status")
    token_id = stored["metadata"]["name"]
    changed = {**stored, "spec": {**stored["spec"], **change}}
    r = admin.put(f"{base}/{token_id}", params={"force": str(force).lower()}, json=changed, timeout=30)
    assert r.status_code == 422, r.text
    assert [c["field"] for c in r.json()["details"]["causes"]] == [field]
    assert "who a token speaks for does not change; issue a new token" in r.json()["message"]
    current = admin.get(f"{base}/{token_id}", timeout=30).json()
    assert (current["spec"]["role"], current["spec"]["subject"]) == ("viewer", subject)
    assert current["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


def test_a_revoke_is_final_and_frees_the_subject_for_another_role(server: Server, store: Store) -> None:
    admin = server.session(server.tokens["admin"])
    base = server.url + f"{GV}/accesstokens"
    first = admin.post(base, json={"role": "scheduler", "name": "rotating"}, timeout=30).json()
    token_id = first["metadata"]["name"]
    revoked = admin.post(f"{base}/{token_id}/revoke", timeout=30).json()
    # Once revoked, the name may speak for another role ...
    r = admin.post(base, json={"role": "operator", "name": "rotating"}, timeout=30)
    assert r.status_code == 201, r.text
    # ... so bringing the old token back would give it two: a revoke stays.
    back = {**revoked, "spec": {**revoked["spec"], "revoked": False}}
    r = admin.put(f"{base}/{token_id}", params={"force": "true"}, json=back, timeout=30)
    assert r.status_code == 422, r.text
    assert [c["field"] for c in r.json()["details"]["causes"]] == ["spec.revoked"]
    assert server.session(first["status"]["token"]).get(
        server.url + f"{GV}/hypervisors", timeout=30).status_code == 401
    assert _live_roles(store, "rotating") == {"operator"}


def test_two_admins_racing_never_leave_one_subject_two_roles(server: Server, store: Store) -> None:
    """Raw records posted at once, each giving one subject another role: the store
    has no uniqueness across records, and yet at most one role stays, and every
    201 is a token that stayed."""
    base = server.url + f"{GV}/accesstokens"
    sessions = [server.session(server.tokens["admin"]) for _ in range(2)]
    kept_201 = 0
    for i in range(12):
        subject = f"race-{i}"
        records = [_record(subject, "viewer")[0], _record(subject, "operator")[0]]
        codes: list[int] = [0, 0]
        start = threading.Barrier(2)

        def post(k: int, records: list[AccessToken] = records, codes: list[int] = codes,
                 start: threading.Barrier = start) -> None:
            start.wait()
            try:
                codes[k] = sessions[k].post(base, json=records[k].to_dict(), timeout=30).status_code
            except requests.RequestException:
                codes[k] = -1

        threads = [threading.Thread(target=post, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(codes) <= {201, 422}, codes
        live = _live_roles(store, subject)
        assert len(live) <= 1, (subject, live)
        stayed = {t.name for t in list_tokens(store) if t.spec.subject == subject}
        assert stayed == {records[k].name for k in (0, 1) if codes[k] == 201}
        kept_201 += len(stayed)
    assert kept_201 >= 1


# -- the rules themselves, on random inputs ------------------------------------------------------

_subjects = st.sampled_from(["nova", "dash", "ops"])
_roles = st.sampled_from(["viewer", "operator", "scheduler", "admin"])
_step = st.one_of(
    st.tuples(st.just("create"), _subjects, _roles),
    st.tuples(st.just("revoke"), st.integers(0, 20)),
    st.tuples(st.just("update"), st.integers(0, 20), _subjects, _roles, st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=25))
def test_no_sequence_of_creates_revokes_and_updates_gives_a_subject_two_roles(
    steps: list[tuple[Any, ...]]
) -> None:
    """What create_token and the PUT path let through (role_conflict on create,
    check_token_update on update) never leaves one subject two live roles."""
    tokens: list[AccessToken] = []
    for step in steps:
        if step[0] == "create":
            new, _ = _record(step[1], step[2])
            if role_conflict(new, tokens) is None:
                tokens.append(new)
        elif tokens:
            i = step[1] % len(tokens)
            old = tokens[i]
            if step[0] == "revoke":
                spec = old.spec.model_copy(update={"revoked": True})
            else:
                spec = old.spec.model_copy(update={"subject": step[2], "role": step[3], "revoked": step[4]})
            new = old.model_copy(update={"spec": spec})
            try:
                check_token_update(old, new)
            except InvalidInput:
                continue
            tokens[i] = new
        for subject in ("nova", "dash", "ops"):
            live = {t.spec.role for t in tokens if t.spec.subject == subject and not t.spec.revoked}
            assert len(live) <= 1, (subject, live)


_label_values = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["role", "zone", "rack"]), _label_values, max_size=2),
    st.dictionaries(st.sampled_from(["note", "owner"]), st.text(max_size=8), max_size=2),
    st.dictionaries(st.sampled_from(["cpu", "memory"]), st.sampled_from([0.5, 1.0, 4.0]), max_size=2),
)
def test_an_agent_create_is_allowed_exactly_when_it_sets_nothing_but_its_name(
    labels: dict[str, str], annotations: dict[str, str], overcommit: dict[str, float]
) -> None:
    hv = Hypervisor.model_validate({
        "metadata": {"name": "hv1", "labels": labels, "annotations": annotations},
        "spec": {"overcommit": overcommit}, "status": {"capacity": {"cpu": 4}}})
    agent = Identity("agent/hv1", "agent", hypervisor="hv1", token_id="t")
    expected = [*(["metadata.annotations"] if annotations else []), *(["metadata.labels"] if labels else []),
                *(["spec"] if overcommit else [])]
    assert not_bare(hv) == expected
    decide = RoleAuthorizer().authorize
    if expected:
        with pytest.raises(Forbidden, match="creates only a bare object"):
            decide(agent, Action("create", "hypervisors", "hv1"), None, hv)
    else:
        decide(agent, Action("create", "hypervisors", "hv1"), None, hv)
    # An operator's create is not bound by it.
    decide(Identity("ops", "operator", token_id="o"), Action("create", "hypervisors", "hv1"), None, hv)
