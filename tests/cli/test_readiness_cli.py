"""One readiness for every reader: `get`, `capacity`, `describe` and `fit --why`
tell the same about a host, as a user sees them, against a real SQLite store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hvfleet.model import Condition, Quantity
from hvfleet.store import open_store

from .conftest import Run


def _observed(db_url: str, name: str, beat: datetime, ready: str = "True") -> None:
    with open_store(db_url) as s:
        def observe(h):  # type: ignore[no-untyped-def]
            status = h.status.model_copy(update={
                "capacity": {"cpu": Quantity(16), "memory": Quantity.parse("64Gi")},
                "allocation": {"cpu": Quantity(2), "memory": Quantity.parse("4Gi")},
                "conditions": [Condition(type="Ready", status=ready, reason="Reconciled")],
                "last_heartbeat_time": beat,
                "observed_generation": h.metadata.generation,
            })
            return h.model_copy(update={"status": status})
        s.update_hypervisor(name, observe, f"agent/{name}")


def _column(out: str, host: str, index: int) -> str:
    line = next(line for line in out.splitlines() if line.startswith(host + " "))
    return line.split()[index]


def test_ready_true_with_a_two_hour_old_heartbeat_is_stale_in_every_view(
    run: Run, db_url: str, tmp_path: object
) -> None:
    manifest = "".join(
        f"---\napiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {{name: {n}}}\n"
        for n in ("old-beat", "fresh")
    )
    path = f"{tmp_path}/fleet.yaml"
    with open(path, "w") as f:
        f.write(manifest)
    assert run("apply", "-f", path).code == 0
    now = datetime.now(UTC)
    _observed(db_url, "old-beat", now - timedelta(hours=2))
    _observed(db_url, "fresh", now)

    got = run("get", "hypervisors")
    assert got.code == 0, got
    assert _column(got.out, "old-beat", 1) == "Stale"
    assert _column(got.out, "fresh", 1) == "Ready"

    table = run("capacity").out
    assert _column(table, "old-beat", 1) == "Stale"
    assert _column(table, "fresh", 1) == "Ready"
    doc = json.loads(run("capacity", "-o", "json").out)
    by_name = {h["name"]: h for h in doc["hosts"]}
    assert by_name["old-beat"]["ready"] is False
    assert by_name["old-beat"]["readiness"]["state"] == "Stale"
    assert by_name["fresh"]["ready"] is True

    described = run("describe", "hypervisor", "old-beat").out
    assert "Readiness:   Stale" in described

    why = json.loads(run("fit", "--cpu", "1", "--why", "-o", "json").out)
    assert [c["name"] for c in why["candidates"]] == ["fresh"]
    assert [r["reason"] for r in why["rejected"]["old-beat"]] == ["stale"]
