"""The role table, checked against the issue's rules written out by hand in
tests/support/role_matrix.py (not derived from ROLE_GRANTS, which is what is
under test): every role × every verb × each resource and subresource is
allowed or Forbidden."""

from __future__ import annotations

from pathlib import Path

import pytest

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.errors import Forbidden
from hvfleet.model.token import ROLES, AccessToken, AccessTokenSpec, Role
from hvfleet.server.auth import ROLE_GRANTS, RoleAuthorizer, role_matrix_markdown
from hvfleet.server.identity import Action, Identity, Selecting, Verb
from hvfleet.store.ownership import agent_manager
from hvfleet.store.sqlite import SqliteStore
from tests.support.role_matrix import EXPECTED, RESOURCES, VERBS


def identity(role: Role) -> Identity:
    if role == "agent":
        return Identity(subject="agent/hv1", role="agent", hypervisor="hv1", token_id="t")
    return Identity(subject=f"{role}-1", role=role, token_id="t")


def action(verb: Verb, key: str, name: str | None, force: bool = False) -> Action:
    resource, _, sub = key.partition("/")
    return Action(verb=verb, resource=resource, name=name, subresource=sub or None, force=force)


def decide(role: Role, verb: Verb, key: str, name: str | None) -> bool:
    try:
        RoleAuthorizer().authorize(identity(role), action(verb, key, name), None, None)
    except Forbidden:
        return False
    return True


CASES = [(r, v, k) for r in ROLES for v in VERBS for k in RESOURCES]


@pytest.mark.parametrize(("role", "verb", "key"), CASES)
def test_every_role_verb_and_resource_is_allowed_or_forbidden(role: Role, verb: Verb, key: str) -> None:
    expected = verb in EXPECTED[role].get(key, "").split()
    # On the caller's own hypervisor's name (hv1) ...
    assert decide(role, verb, key, "hv1") is expected
    # ... and on another's: agents lose everything, the other roles nothing. A
    # policy's name is no host's: an agent's read of policies is narrowed instead.
    narrowed = role == "agent" and key == "overcommitpolicies"
    assert decide(role, verb, key, "hv2") is (expected and (role != "agent" or narrowed))


@pytest.mark.parametrize("verb", ["list", "watch"])
def test_an_agent_lists_and_watches_only_its_own_hypervisor(verb: Verb) -> None:
    with pytest.raises(Forbidden, match=r"metadata.name=hv1"):
        RoleAuthorizer().authorize(identity("agent"), action(verb, "hypervisors", None), None, None)
    assert decide("agent", verb, "hypervisors", "hv1")
    assert decide("viewer", verb, "hypervisors", None)


@pytest.mark.parametrize("verb", VERBS)
def test_an_agent_reads_only_the_policies_selecting_its_host_and_writes_none(verb: Verb) -> None:
    auth = RoleAuthorizer()
    for name in (None, "compute-cpu"):
        if verb in ("get", "list", "watch"):
            got = auth.authorize(identity("agent"), action(verb, "overcommitpolicies", name), None, None)
            assert got == Selecting("hv1")
        else:
            with pytest.raises(Forbidden, match="role agent touches only its own hypervisor"):
                auth.authorize(identity("agent"), action(verb, "overcommitpolicies", name), None, None)
    # Every other role reads them whole, and nothing else of an agent's is narrowed.
    for role in ("viewer", "operator", "scheduler", "admin"):
        if verb in ("get", "list", "watch"):
            assert auth.authorize(identity(role), action(verb, "overcommitpolicies", None), None,
                                  None) is None
    if verb in ("get", "list", "watch"):
        assert auth.authorize(identity("agent"), action(verb, "hypervisors", "hv1"), None, None) is None


def test_an_agent_token_bound_to_no_hypervisor_reads_no_policy() -> None:
    unbound = Identity(subject="agent/", role="agent", hypervisor=None, token_id="t")
    with pytest.raises(Forbidden):
        RoleAuthorizer().authorize(unbound, action("list", "overcommitpolicies", None), None, None)


def test_agent_a_cannot_write_b_status_in_the_authorizer_or_the_store(tmp_path: Path) -> None:
    auth = RoleAuthorizer()
    b = Hypervisor(metadata=ObjectMeta(name="hv2"))
    for verb in ("update", "patch"):
        with pytest.raises(Forbidden, match=r'"agent/hv1" cannot \w+ resource "hypervisors/status"'):
            auth.authorize(identity("agent"), action(verb, "hypervisors/status", "hv2"), b, b)
    # The name in the body counts too: a request for hv1 carrying hv2's object is refused.
    with pytest.raises(Forbidden):
        auth.authorize(identity("agent"), action("update", "hypervisors/status", "hv1"), b, b)
    with pytest.raises(Forbidden):
        auth.authorize(identity("agent"), action("create", "hypervisors", None), None, b)
    # And where the write is accepted: the store refuses hv1's agent as hv2's status writer.
    with SqliteStore(str(tmp_path / "s.db")) as store:
        stored = store.create(b, agent_manager("hv2"))
        assert isinstance(stored, Hypervisor)
        changed = stored.model_copy(update={"status": stored.status.model_copy(
            update={"observed_generation": 1})})
        with pytest.raises(Forbidden):
            store.update(changed, agent_manager("hv1"))


def test_an_agent_creates_its_own_hypervisor_from_the_body_name() -> None:
    own = Hypervisor(metadata=ObjectMeta(name="hv1"))
    RoleAuthorizer().authorize(identity("agent"), action("create", "hypervisors", None), None, own)


@pytest.mark.parametrize("role", ROLES)
def test_only_operator_and_admin_may_force(role: Role) -> None:
    key = "hypervisors/status" if role == "agent" else "hypervisors"
    try:
        RoleAuthorizer().authorize(identity(role), action("patch", key, "hv1", force=True), None, None)
        forced = True
    except Forbidden as exc:
        forced = False
        if role in ("scheduler", "agent"):
            assert "may not force" in str(exc)
    assert forced is (role in ("operator", "admin"))


def test_a_token_record_is_never_served_as_another_resource() -> None:
    record = AccessToken(
        metadata=ObjectMeta(name="0123456789abcdef"),
        spec=AccessTokenSpec(subject="v", role="viewer", secret_sha256="0" * 64),
    )
    with pytest.raises(Forbidden, match="served only as tokens"):
        RoleAuthorizer().authorize(identity("admin"), action("get", "hypervisors", "x"), record, None)
    hv = Hypervisor(metadata=ObjectMeta(name="x"))
    with pytest.raises(Forbidden, match="served only as tokens"):
        RoleAuthorizer().authorize(identity("admin"), action("create", "tokens", None), None, hv)
    RoleAuthorizer().authorize(identity("admin"), action("get", "tokens", record.name), record, None)


def test_forbidden_reads_as_kube_apiserver_words_it() -> None:
    with pytest.raises(Forbidden) as err:
        RoleAuthorizer().authorize(identity("viewer"), action("patch", "hypervisors", "hv1"), None, None)
    assert str(err.value) == (
        'hypervisors.hvfleet.io "hv1" is forbidden: User "viewer-1" cannot patch resource '
        '"hypervisors" in API group "hvfleet.io": role viewer reads and watches only'
    )


@pytest.mark.parametrize(("verb", "key", "why"), [
    ("patch", "reservations", "role admin may not patch reservations: a reservation holds what its claim "
                              "checked"),
    ("update", "hypervisors/status", "status is written only by 'agent/hv1'"),
    ("delete", "overcommitpolicies/status", "role admin may not delete overcommitpolicies/status"),
])
def test_what_admin_may_not_do_is_said_for_that_resource(verb: Verb, key: str, why: str) -> None:
    """Every refusal of admin said "role admin does not write a hypervisor's
    status", a reservation's patch and an access review of '*' included."""
    with pytest.raises(Forbidden) as err:
        RoleAuthorizer().authorize(identity("admin"), action(verb, key, "hv1"), None, None)
    assert why in str(err.value)
    assert "hypervisor's status" not in str(err.value)


def test_docs_show_the_role_table_as_it_is() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert role_matrix_markdown() in docs
    assert set(ROLE_GRANTS) == set(ROLES)
