"""What only the remote backend has: answers mapped to error classes, an
unreachable or untrusted server, where the token and CA come from, and its
watch (Gone, stop and idle timeout) against the real API server of conftest."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.store.conftest import remote_backend

from hvfleet.model import Hypervisor
from hvfleet.model.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    HvfleetError,
    InvalidInput,
    NotFound,
    TooLarge,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)
from hvfleet.store import open_store
from hvfleet.store import sqlite as sqlite_backend
from hvfleet.store.base import ClaimRefused, OwnershipConflict, StaleVersion
from hvfleet.store.kubeconfig import dump_kubeconfig, render_kubeconfig
from hvfleet.store.remote import RemoteStore, error_from_status, find_credentials
from hvfleet.store.statuses import STATUS_OF

TOKEN = "hvf_0123456789abcdef_" + "x" * 43


def _status(code: int, reason: str, causes: list[dict[str, str]] | None = None,
            **details: str) -> dict[str, Any]:
    d: dict[str, Any] = dict(details)
    if causes:
        d["causes"] = causes
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": f"m-{reason}",
            "reason": reason, "code": code, "details": d}


@pytest.mark.parametrize(("code", "reason", "causes", "cls"), [
    (404, "NotFound", None, NotFound),
    (409, "AlreadyExists", None, AlreadyExists),
    (409, "Conflict", None, Conflict),
    (409, "Conflict", [{"reason": "FieldValueInvalid", "field": "metadata.resourceVersion",
                        "message": "stale"}], StaleVersion),
    (422, "Invalid", None, InvalidInput),
    (400, "BadRequest", None, BadRequest),
    (403, "Forbidden", None, Forbidden),
    (401, "Unauthorized", None, Unauthorized),
    (410, "Expired", None, Gone),
    (413, "RequestEntityTooLarge", None, TooLarge),
    (429, "TooManyRequests", None, TooManyRequests),
    (503, "ServiceUnavailable", None, Unavailable),
    (500, "InternalError", None, Unavailable),
    (404, "", None, NotFound),  # no reason: the code decides
])
def test_answers_map_to_error_classes_by_reason_and_causes(
    code: int, reason: str, causes: list[dict[str, str]] | None, cls: type[HvfleetError]
) -> None:
    err = error_from_status(code, _status(code, reason, causes), "GET /x")
    assert type(err) is cls
    # Only a plain Conflict's subclasses are told apart by causes, never by the message.
    assert not isinstance(err, Conflict) or type(err) in (Conflict, StaleVersion)


def test_every_class_the_server_answers_with_is_read_back_as_itself() -> None:
    """The two ends of one table (hvfleet.store.statuses): what `hvfleet serve`
    answers for a model error class, the remote store raises again, by its
    reason and, where a proxy dropped the reason, by its code alone."""
    for cls, (code, reason) in STATUS_OF.items():
        if cls is HvfleetError:
            continue
        assert type(error_from_status(code, _status(code, reason), "GET /x")) is cls, cls
        bare = error_from_status(code, _status(code, ""), "GET /x")
        assert type(bare) is (cls if code in (400, 401, 403, 410, 413, 415, 429) else
                              InvalidInput if code == 422 else
                              Conflict if code == 409 else NotFound if code == 404 else Unavailable), cls


def test_ownership_conflicts_keep_every_field_and_owner_and_the_stores_message() -> None:
    causes = [{"reason": "FieldManagerConflict", "message": 'conflict with "cortex"',
               "field": ".spec.overcommit.cpu"},
              {"reason": "FieldManagerConflict", "message": 'conflict with "ops"',
               "field": ".spec.overcommit.memory"}]
    err = error_from_status(409, _status(409, "Conflict", causes, kind="hypervisors", name="hv1"), "PUT")
    assert isinstance(err, OwnershipConflict)
    assert err.conflicts == [("spec.overcommit.cpu", "cortex"), ("spec.overcommit.memory", "ops")]
    assert str(err) == ("Hypervisor hv1: spec.overcommit.cpu is owned by manager 'cortex' "
                        "(and 1 more); force the write to take it over")
    # A claim's rejections come back whole, for DoesNotFit.
    refused = error_from_status(409, _status(409, "Conflict", [
        {"reason": "insufficient", "message": "cpu: 9 > 4", "field": "spec.resources.cpu"},
        {"reason": "stale", "message": "old heartbeat"}]), "POST", claim_host="hv1")
    assert isinstance(refused, ClaimRefused) and refused.host == "hv1"
    assert refused.rejections == [("insufficient", "cpu: 9 > 4", "cpu"), ("stale", "old heartbeat", None)]
    # One field cause: InvalidInput names the field (the CLI maps it to its flag).
    invalid = error_from_status(422, _status(422, "Invalid", [
        {"reason": "FieldValueInvalid", "message": "must be positive", "field": "ttl"}]), "POST")
    assert isinstance(invalid, InvalidInput) and invalid.field == "ttl"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_that_cannot_be_reached_is_unavailable_naming_the_url() -> None:
    url = f"https://127.0.0.1:{_closed_port()}"
    with RemoteStore(url, TOKEN) as s, pytest.raises(Unavailable) as caught:
        s.get("Hypervisor", "hv1")
    text = str(caught.value)
    assert text.startswith(f"store {url}: cannot reach the server:") and "\n" not in text


@pytest.fixture
def remote_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with remote_backend(request, tmp_path) as url:
        yield url


def test_a_server_whose_certificate_is_not_trusted_is_unavailable(
    remote_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HVFLEET_CA")  # only the system's CAs: the server's own is not among them
    with open_store(remote_url) as s, pytest.raises(Unavailable, match="certificate"):
        s.revision()


def test_credentials_come_from_the_kubeconfig_of_that_server_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HVFLEET_TOKEN", raising=False)
    monkeypatch.delenv("HVFLEET_CA", raising=False)
    ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    config = tmp_path / "config"
    config.write_text(dump_kubeconfig(render_kubeconfig("https://10.0.0.1:8443", TOKEN, ca)))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{config}")
    got = find_credentials("https://10.0.0.1:8443")
    assert got.token == TOKEN and got.ca_pem == ca
    # Another server gets nothing from it: its token is not sent elsewhere.
    other = find_credentials("https://10.0.0.2:8443")
    assert other.token is None and other.ca_pem is None
    # Flags (their environment variables) win over the kubeconfig.
    mine = tmp_path / "ca.pem"
    mine.write_bytes(b"mine")
    monkeypatch.setenv("HVFLEET_TOKEN", "hvf_flag")
    monkeypatch.setenv("HVFLEET_CA", str(mine))
    got = find_credentials("https://10.0.0.1:8443")
    assert got.token == "hvf_flag" and got.ca_pem == b"mine"


def test_store_urls_of_the_remote_backend() -> None:
    with pytest.raises(InvalidInput, match="unknown parameter 'prefix'"):
        open_store("https://127.0.0.1:8443?prefix=/x")
    with pytest.raises(InvalidInput, match="loopback"):
        open_store("http://10.0.0.1:8080")
    with pytest.raises(InvalidInput, match="HOST:PORT only"):
        open_store("https://127.0.0.1:8443/apis")


def test_an_idle_watch_ends_on_stop_and_on_its_timeout(remote_url: str) -> None:
    with open_store(remote_url) as s:
        since = s.revision()
        t0 = time.monotonic()
        assert list(s.watch("Hypervisor", since=since, timeout=0.3)) == []
        assert 0.25 <= time.monotonic() - t0 < 3
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        t0 = time.monotonic()
        assert list(s.watch(None, since=since, stop=stop)) == []
        assert time.monotonic() - t0 < 3


def test_a_watch_from_a_compacted_revision_is_gone(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    make_hypervisor: Callable[..., Hypervisor],
) -> None:
    monkeypatch.setattr(sqlite_backend, "EVENT_HISTORY", 5)
    monkeypatch.setattr(sqlite_backend, "_COMPACT_EVERY", 5)
    with remote_backend(request, tmp_path) as url, open_store(url) as s:
        for i in range(12):
            s.create(make_hypervisor(f"hv{i}"), "operator")
        with pytest.raises(Gone):
            list(s.watch("Hypervisor", since=1, timeout=2))
        recent = list(s.watch("Hypervisor", since=s.revision() - 2, timeout=0.3))
        assert [e.object.metadata.name for e in recent] == ["hv10", "hv11"]


def test_a_write_to_another_object_under_the_name_is_a_conflict_not_a_stale_write(
    remote_url: str, make_hypervisor: Callable[..., Hypervisor],
) -> None:
    """The server answers a UID precondition failure as a plain Conflict and a
    stale resourceVersion with its cause: the remote store raises StaleVersion
    (which its callers retry) only for the second."""
    with open_store(remote_url) as s:
        made = s.create(make_hypervisor("hv1"), "operator")
        moved = s.update(made.model_copy(update={"metadata": made.metadata.model_copy(
            update={"labels": {"rack": "b"}})}), "operator")
        with pytest.raises(StaleVersion):
            s.update(made, "operator")
        other = moved.model_copy(update={"metadata": moved.metadata.model_copy(
            update={"uid": "0b6c1b52-uid-of-another", "labels": {"rack": "c"}})})
        with pytest.raises(Conflict, match="Precondition failed: UID in precondition") as caught:
            s.update(other, "operator")
        assert type(caught.value) is Conflict
        assert s.get("Hypervisor", "hv1").metadata.labels == {"rack": "b"}
