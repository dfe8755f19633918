"""The audit log: one JSON line per write, with who, verb, object, versions and result."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hvfleet.server.audit import AUDIT_LOGGER, audit_write, configure_audit_log
from hvfleet.server.identity import Action, Identity

AGENT = Identity(subject="agent/hv1", role="agent", hypervisor="hv1", token_id="0123456789abcdef")
WHEN = datetime(2026, 12, 1, 9, 0, 0, 123000, tzinfo=UTC)


@pytest.fixture
def audit_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "audit.log"
    handler = configure_audit_log(str(path))
    yield path
    logger = logging.getLogger(AUDIT_LOGGER)
    logger.removeHandler(handler)
    handler.close()
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


def lines(path: Path) -> list[dict[str, object]]:
    for h in logging.getLogger(AUDIT_LOGGER).handlers:
        h.flush()
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_write_is_one_json_line_with_who_what_versions_and_result(audit_file: Path) -> None:
    action = Action(verb="patch", resource="hypervisors", name="hv1", subresource="status")
    audit_write(AGENT, action, "41", "42", 200, "OK", now=WHEN)
    assert lines(audit_file) == [{
        "ts": "2026-12-01T09:00:00.123Z",
        "user": {"subject": "agent/hv1", "role": "agent", "tokenId": "0123456789abcdef",
                 "hypervisor": "hv1"},
        "verb": "patch",
        "objectRef": {"apiGroup": "hvfleet.io", "resource": "hypervisors",
                      "subresource": "status", "name": "hv1"},
        "force": False,
        "resourceVersion": {"before": "41", "after": "42"},
        "code": 200,
        "reason": "OK",
    }]
    assert stat.S_IMODE(os.stat(audit_file).st_mode) == 0o600


def test_refused_and_unauthenticated_writes_are_logged_too(audit_file: Path) -> None:
    viewer = Identity(subject="ops\nfake-line", role="viewer", token_id="fedcba9876543210")
    audit_write(viewer, Action(verb="delete", resource="reservations", name="r1"), "7", None,
                403, "Forbidden")
    audit_write(None, Action(verb="create", resource="hypervisors"), None, None, 401, "Unauthorized")
    text = audit_file.read_text()
    assert text.count("\n") == 2  # a newline in a name cannot forge a second line
    first, second = lines(audit_file)
    assert first["user"] == {"subject": "ops\nfake-line", "role": "viewer", "tokenId": "fedcba9876543210"}
    assert (first["code"], first["reason"], first["resourceVersion"]) == (
        403, "Forbidden", {"before": "7", "after": None})
    assert second["user"] is None
    assert second["objectRef"] == {"apiGroup": "hvfleet.io", "resource": "hypervisors"}


def test_nothing_is_formatted_while_the_audit_log_is_off(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=AUDIT_LOGGER):
        audit_write(AGENT, Action(verb="create", resource="leases", name="hv1"), None, "1", 201, "Created")
    assert caplog.records == []
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
        audit_write(AGENT, Action(verb="create", resource="leases", name="hv1"), None, "1", 201, "Created")
    [record] = caplog.records
    assert json.loads(record.getMessage())["objectRef"]["resource"] == "leases"


def test_a_write_refused_before_the_write_itself_has_its_line_once(make_api: Any) -> None:
    """A DELETE, PATCH or PUT of an object that is not there, a JSON patch that
    does not apply, a merge patch whose result is not valid: each refused
    before the store's write, each wrote no audit line (probe 14). One line
    each now, with the code the caller got, and still one line, not two, for a
    refusal the write itself meets."""
    from tests.server.objects import HV, hypervisor
    from tests.server.static_auth import RecordingAudit

    audit = RecordingAudit()
    api = make_api(audit=audit)
    c = api.client()
    assert c.post(HV, json=hypervisor("hv0")).status_code == 201
    first = c.get(f"{HV}/hv0").json()["metadata"]["resourceVersion"]
    assert c.patch(f"{HV}/hv0", {"metadata": {"labels": {"x": "y"}}}).status_code == 200
    calls = [
        (lambda: c.delete(f"{HV}/gone"), "delete", 404),
        (lambda: c.patch(f"{HV}/gone", {"spec": {"maintenance": "drain"}}), "patch", 404),
        (lambda: c.call("PUT", f"{HV}/gone", json=hypervisor("gone")), "update", 404),
        (lambda: c.patch(f"{HV}/hv0", [{"op": "test", "path": "/spec/maintenance", "value": "x"}],
                         content_type="application/json-patch+json"), "patch", 422),
        (lambda: c.patch(f"{HV}/hv0", {"spec": {"maintenance": "sometimes"}}), "patch", 422),
        # Refused before anything is read (probe 14): the body, its media type, the answer asked for.
        (lambda: c.call("POST", HV, json={**hypervisor("bad"), "spec": {"maintenance": "often"}}),
         "create", 422),
        (lambda: c.call("POST", f"{HV}?fieldValidation=Strict", json={**hypervisor("bad"), "x": 1}),
         "create", 400),
        (lambda: c.call("POST", HV, data="{not json", headers={"Content-Type": "application/json"}),
         "create", 400),
        (lambda: c.patch(f"{HV}/hv0", {"spec": {}}, content_type="application/strategic-merge-patch+json"),
         "patch", 415),
        (lambda: c.call("PUT", f"{HV}/hv0", json=hypervisor("other")), "update", 400),
        (lambda: c.delete(f"{HV}/hv0", headers={"Accept": "text/plain"}), "delete", 406),
        (lambda: c.delete(f"{HV}/hv0", json={"propagationPolicy": "Sideways"}), "delete", 422),
        # Refused by the write itself (a stale version): still one line.
        (lambda: c.call("PUT", f"{HV}/hv0", json={**hypervisor("hv0"),
                                                 "metadata": {"name": "hv0", "resourceVersion": first}}),
         "update", 409),
    ]
    for call, verb, code in calls:
        before = len(audit.records)
        r = call()
        assert r.status_code == code, r.text
        made = audit.records[before:]
        assert [(m.action.verb, m.code) for m in made] == [(verb, code)], (verb, code, made)
