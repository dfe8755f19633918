"""One duration grammar through the real `hvfleet` entry point: `reserve --ttl`
and `fit --staleness` take what `agent --resync` takes, and the other way round."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sched_fleet import host, now, put_host

from hvfleet.model.hypervisor import Reservation
from hvfleet.store import open_store


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/hvfleet.db"
    monkeypatch.setenv("HVFLEET_STORE", url)
    with open_store(url) as s:
        put_host(s, host("hv-a", {"cpu": 8, "memory": "32Gi"}, beat=now()))
    return url


@pytest.mark.parametrize(("ttl", "life"), [("1.5m", timedelta(seconds=90)),
                                           ("1h30m", timedelta(minutes=90))])
def test_reserve_ttl_takes_decimal_and_compound_durations(
    url: str, run: Any, ttl: str, life: timedelta
) -> None:
    r = run("reserve", "hv-a", "--cpu", "1", "--consumer", str(uuid.uuid4()), "--ttl", ttl)
    assert r.code == 0, r.err
    with open_store(url) as s:
        made = s.get("Reservation", r.out.strip())
    assert isinstance(made, Reservation) and made.spec.expires_at is not None
    left = made.spec.expires_at - made.metadata.creation_timestamp  # type: ignore[operator]
    assert abs(left - life) < timedelta(seconds=5)


def test_reserve_ttl_never_does_not_expire(url: str, run: Any) -> None:
    r = run("reserve", "hv-a", "--cpu", "1", "--consumer", str(uuid.uuid4()), "--ttl", "never")
    assert r.code == 0, r.err
    with open_store(url) as s:
        made = s.get("Reservation", r.out.strip())
    assert isinstance(made, Reservation) and made.spec.expires_at is None


def test_fit_staleness_takes_a_compound_duration_and_refuses_zero(url: str, run: Any) -> None:
    assert run("fit", "--cpu", "1", "--staleness", "1h30m").code == 0
    r = run("fit", "--cpu", "1", "--staleness", "0")
    assert r.code == 2
    assert r.err.startswith("error: --staleness: '0' must be longer than 0"), r.err


def test_agent_resync_takes_a_compound_duration(tmp_path: Path, run: Any) -> None:
    r = run("agent", "--connect", "test:///default", "--name", "default-host",
            "--store", f"sqlite:///{tmp_path}/a.db", "--once", "--resync", "1h30m")
    assert r.code == 0, r.err
    r = run("agent", "--connect", "test:///default", "--name", "default-host",
            "--store", f"sqlite:///{tmp_path}/a.db", "--once", "--resync", "1.x")
    assert r.code == 2
    assert r.err.startswith("error: --resync: '1.x' is not a duration"), r.err
