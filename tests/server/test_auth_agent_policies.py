"""Issue 20 over the real `hvfleet serve` (TLS, tokens in the store, the role
table): an agent token reads and watches the OvercommitPolicies that select its
own hypervisor, judged by that host's labels when it asks, and no other —
nor writes any. kubectl with the agent's kubeconfig sees the same. A property
test replays any sequence of policy changes through the narrowed watch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.errors import Forbidden
from hvfleet.model.hypervisor import OvercommitPolicy, Resource
from hvfleet.model.overcommit import selects
from hvfleet.model.selectors import parse_selector
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.server.context import ApiContext, Limits
from hvfleet.server.identity import Action, Identity, Selecting
from hvfleet.server.watch import seen_through
from hvfleet.store import Store, open_store
from hvfleet.store.base import WatchEvent
from hvfleet.store.sqlite import SqliteStore
from tests.support.serve import (
    GV,
    SETUP,
    Server,
    kubeconfig_for,
    kubectl,
)

POLICIES = f"{GV}/overcommitpolicies"


def policy(name: str, selector: dict[str, Any], cpu: float = 2) -> OvercommitPolicy:
    return OvercommitPolicy.model_validate(
        {"metadata": {"name": name}, "spec": {"selector": selector, "overcommit": {"cpu": cpu}}})



@pytest.fixture
def store(server: Server) -> Iterator[Store]:
    """hv1 (role=compute, the agent token's host) and hv2 (role=edge); policies
    for compute, for edge, and one for every host."""
    with open_store(server.store_url) as s:
        for p in s.list_overcommit_policies():
            s.delete("OvercommitPolicy", p.name)
        for h in s.list_hypervisors():
            s.delete("Hypervisor", h.name)
        for name, role in (("hv1", "compute"), ("hv2", "edge")):
            s.create(Hypervisor(metadata=ObjectMeta(name=name, labels={"role": role})), SETUP)
        s.create(policy("compute-cpu", {"matchLabels": {"role": "compute"}}), SETUP)
        s.create(policy("edge-cpu", {"matchLabels": {"role": "edge"}}), SETUP)
        s.create(policy("everyone", {}), SETUP)
        yield s


def names(doc: dict[str, Any]) -> list[str]:
    return [i["metadata"]["name"] for i in doc["items"]]


def test_an_agent_lists_and_gets_only_the_policies_selecting_its_host(
    server: Server, store: Store
) -> None:
    agent = server.session(server.tokens["agent"])  # bound to hv1
    listed = agent.get(server.url + POLICIES, timeout=30)
    assert listed.status_code == 200, listed.text
    assert names(listed.json()) == ["compute-cpu", "everyone"]
    assert agent.get(server.url + f"{POLICIES}/compute-cpu", timeout=30).status_code == 200
    # Another host's policy and one that does not exist: the same 403, naming why.
    for name in ("edge-cpu", "no-such-policy"):
        denied = agent.get(server.url + f"{POLICIES}/{name}", timeout=30)
        assert denied.status_code == 403, denied.text
        assert denied.json()["message"] == (
            f'overcommitpolicies.hvfleet.io "{name}" is forbidden: User "agent/hv1" cannot get '
            'resource "overcommitpolicies" in API group "hvfleet.io": role agent, bound to '
            "hypervisor hv1, reads only the overcommitpolicies whose selector selects hypervisor hv1")
    # As a Table, a policy counts only the agent's own host, not the fleet's.
    table = agent.get(server.url + POLICIES, timeout=30,
                      headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert table.status_code == 200, table.text
    column = [c["name"] for c in table.json()["columnDefinitions"]].index("HYPERVISORS")
    assert [r["cells"][column] for r in table.json()["rows"]] == ["1", "1"]
    # The viewer reads them all; the host's labels decide, as they are now.
    viewer = server.session(server.tokens["viewer"])
    assert names(viewer.get(server.url + POLICIES, timeout=30).json()) == [
        "compute-cpu", "edge-cpu", "everyone"]
    hv1 = store.get_hypervisor("hv1")
    store.update(hv1.model_copy(update={"metadata": hv1.metadata.model_copy(
        update={"labels": {"role": "edge"}})}), SETUP)
    assert names(agent.get(server.url + POLICIES, timeout=30).json()) == ["edge-cpu", "everyone"]
    assert agent.get(server.url + f"{POLICIES}/compute-cpu", timeout=30).status_code == 403


def test_an_agent_writes_no_policy(server: Server, store: Store) -> None:
    agent = server.session(server.tokens["agent"])
    before = [p.to_dict() for p in store.list_overcommit_policies()]
    doc = policy("mine", {}, cpu=16).to_dict()
    assert agent.post(server.url + POLICIES, json=doc, timeout=30).status_code == 403
    patched = agent.patch(server.url + f"{POLICIES}/compute-cpu", timeout=30,
                          data=json.dumps({"spec": {"overcommit": {"cpu": 16}}}),
                          headers={"Content-Type": "application/merge-patch+json"})
    assert patched.status_code == 403
    assert agent.delete(server.url + f"{POLICIES}/everyone", timeout=30).status_code == 403
    assert [p.to_dict() for p in store.list_overcommit_policies()] == before


def test_an_agent_watch_shows_policies_entering_and_leaving_its_selection(
    server: Server, store: Store
) -> None:
    agent = server.session(server.tokens["agent"])
    rv = agent.get(server.url + POLICIES, timeout=30).json()["metadata"]["resourceVersion"]

    def respec(name: str, selector: dict[str, Any], cpu: float = 2) -> None:
        p = store.get("OvercommitPolicy", name)
        assert isinstance(p, OvercommitPolicy)
        spec = p.spec.model_copy(update={"selector": type(p.spec.selector).model_validate(selector),
                                         "overcommit": {"cpu": cpu}})
        store.update(p.model_copy(update={"spec": spec}), SETUP)

    respec("edge-cpu", {"matchLabels": {"role": "edge"}}, cpu=5)  # not hv1's: never shown
    respec("compute-cpu", {"matchLabels": {"role": "compute"}}, cpu=4)  # hv1's: MODIFIED
    respec("compute-cpu", {"matchLabels": {"role": "edge"}})  # leaves hv1: DELETED
    respec("edge-cpu", {"matchExpressions": [  # enters: ADDED
        {"key": "role", "operator": "In", "values": ["compute", "edge"]}]})
    store.create(policy("gpu", {"matchLabels": {"role": "gpu"}}), SETUP)  # never shown
    store.delete("OvercommitPolicy", "everyone")  # hv1's: DELETED
    params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "2"}
    with agent.get(server.url + POLICIES, params=params, stream=True, timeout=30) as resp:
        assert resp.status_code == 200
        events = [json.loads(line) for line in resp.iter_lines() if line]
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in events]
    assert seen == [("MODIFIED", "compute-cpu"), ("DELETED", "compute-cpu"),
                    ("ADDED", "edge-cpu"), ("DELETED", "everyone")]
    # Leaving is told with the content the agent held, not the one it may not read.
    assert events[1]["object"]["spec"]["selector"]["matchLabels"] == {"role": "compute"}
    # From now (no version): the current ones it may see, as ADDED.
    params = {"watch": "true", "timeoutSeconds": "1"}
    with agent.get(server.url + POLICIES, params=params, stream=True, timeout=30) as resp:
        now = [json.loads(line) for line in resp.iter_lines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in now] == [("ADDED", "edge-cpu")]


def test_kubectl_with_an_agent_kubeconfig_sees_only_its_policies(
    server: Server, store: Store, tmp_path: Path
) -> None:
    config = kubeconfig_for(server, server.tokens["agent"], tmp_path / "agent.yaml")
    got = kubectl(config, "get", "overcommitpolicies", "-o", "name")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["overcommitpolicy.hvfleet.io/compute-cpu",
                                  "overcommitpolicy.hvfleet.io/everyone"]
    denied = kubectl(config, "get", "overcommitpolicy", "edge-cpu")
    assert denied.returncode == 1
    assert "Error from server (Forbidden)" in denied.stderr and "edge-cpu" in denied.stderr


# -- the narrowed watch, as a property ----------------------------------------------------------

HOST_LABELS = {"role": "compute", "az": "1"}
SELECTORS: list[dict[str, Any]] = [
    {}, {"matchLabels": {"role": "compute"}}, {"matchLabels": {"role": "edge"}},
    {"matchLabels": {"az": "1"}}, {"matchLabels": {"role": "compute", "az": "2"}},
    {"matchExpressions": [{"key": "role", "operator": "NotIn", "values": ["compute"]}]},
    {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]},
]


def _visible(obj: Resource) -> bool:
    return isinstance(obj, OvercommitPolicy) and selects(obj, HOST_LABELS)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                          st.none() | st.sampled_from(range(len(SELECTORS)))), max_size=40),
       st.sampled_from(["", "team=x"]))
def test_a_narrowed_watch_replayed_holds_exactly_the_policies_selecting_the_host(
    steps: list[tuple[str, int | None]], label_selector: str
) -> None:
    """Whatever sequence of creates, selector changes and deletes: a client that
    applies what an agent's watch shows holds exactly the policies that select
    its host, and is never shown content of one that does not."""
    selector = parse_selector(label_selector)
    stored: dict[str, OvercommitPolicy] = {}
    client: dict[str, Resource] = {}
    for revision, (name, which) in enumerate(steps, start=1):
        before = stored.get(name)
        if which is None:
            if before is None:
                continue
            event = WatchEvent("DELETED", before, revision)
            del stored[name]
        else:
            labels = {"team": "x"} if label_selector else {}
            p = policy(name, SELECTORS[which]).model_copy(
                update={"metadata": ObjectMeta(name=name, labels=labels)})
            event = WatchEvent("MODIFIED" if before else "ADDED", p, revision,
                               before=(lambda b=before: b) if before else None)
            stored[name] = p
        seen = seen_through(event, selector, _visible)
        if seen is not None:
            type_, obj = seen
            assert _visible(obj), f"{type_} showed {obj.metadata.name}, which it may not read"
            if type_ == "DELETED":
                client.pop(obj.metadata.name, None)
            else:
                client[obj.metadata.name] = obj
        assert client == {n: p for n, p in stored.items() if _visible(p)}


def test_a_handler_that_cannot_narrow_refuses_the_narrowed_read(tmp_path: Path) -> None:
    """Fail closed: ApiContext.authorize (for handlers that serve whole objects)
    refuses what only authorize_read, whose callers narrow, may allow."""
    agent = Identity(subject="agent/hv1", role="agent", hypervisor="hv1", token_id="t")
    with SqliteStore(str(tmp_path / "s.db")) as store:
        ctx = ApiContext(store, TokenAuthenticator(store), RoleAuthorizer(), None, Limits())
        try:
            action = Action("list", "overcommitpolicies")
            assert ctx.authorize_read(agent, action) == Selecting("hv1")
            with pytest.raises(Forbidden, match="reads only the overcommitpolicies whose selector"):
                ctx.authorize(agent, action)
        finally:
            ctx.close()
