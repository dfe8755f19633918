"""One truth, not two copies (issue 18): the Placement API's hypervisor roots
are read from the fleet index `fit` reads, not from a second follow of the
store. In `hvfleet serve` the Placement snapshot and `fit` hold the same
FleetIndex object; the snapshot applies no Hypervisor event itself (a host
write reaches Placement only through the index); the providers it hands out
carry the index's own Hypervisor objects; and a host write shows in
`allocation_candidates` and in `fit` at the same index version (SQLite, and
etcd, where the index follows the store's one stream in a thread)."""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from hvfleet.model.hypervisor import Hypervisor
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.placement import provider_uuid
from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.store import Store, open_store
from hvfleet.store.base import WatchEvent
from hvfleet.store.tokens import issue_token
from tests.scheduling.sched_fleet import OPERATOR, host, put_host
from tests.server.running import ServerThread
from tests.server.tls_files import make_tls_files
from tests.support.etcd_local import EtcdCluster

GV = "/apis/hvfleet.io/v1"
CANDIDATES = "/placement/allocation_candidates?resources=VCPU:10"


def _fleet(store: Store) -> None:
    beat = datetime.now(UTC)
    for name, used in [("hv1", 0), ("hv2", 10)]:
        put_host(store, host(name, {"cpu": 16, "memory": "64Gi"}, allocation={"cpu": used},
                             overcommit={"cpu": 1.0}, beat=beat))


def _overcommit(store: Store, name: str, ratio: float) -> None:
    h = store.get_hypervisor(name)
    spec = h.spec.model_copy(update={"overcommit": {**h.spec.overcommit, "cpu": ratio}})
    store.update(h.model_copy(update={"spec": spec}), OPERATOR)


def test_the_snapshot_takes_hosts_from_the_index_and_follows_none_itself(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/h.db")
    _fleet(store)
    index = FleetIndex.from_store(store)
    snap = ProviderSnapshot.from_store(store, index=index)
    uid = provider_uuid(store.get_hypervisor("hv2"))
    first = snap.graph()
    assert first.providers[uid].inventories["VCPU"].allocation_ratio == 1.0
    # The index's own Hypervisor object, not a copy the snapshot keeps.
    assert snap.fleet().providers[uid].hypervisor is index.host("hv2")
    _overcommit(store, "hv2", 2.0)
    written = store.get_hypervisor("hv2")
    # Handed the host's event directly, the snapshot lets it pass: hosts are the index's.
    snap.apply(WatchEvent(type="MODIFIED", object=written, revision=store.revision()))
    assert snap.graph() is first
    # The index catching up alone (no refresh of the snapshot) is what changes the root.
    index.refresh(store)
    second = snap.graph()
    assert second is not first and second.basis is not None and second.basis.changed == {uid}
    assert second.providers[uid].inventories["VCPU"].allocation_ratio == 2.0
    assert snap.fleet().providers[uid].hypervisor is index.host("hv2")
    assert snap.index_version == index.placement_version
    store.close()


@pytest.fixture(params=["sqlite", "etcd"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path, Store, dict[str, str], Any]]:
    d = Path(tempfile.mkdtemp())
    if request.param == "sqlite":
        store = open_store(f"sqlite:///{d}/hvfleet.db")
    else:
        etcd: EtcdCluster = request.getfixturevalue("etcd_session")
        store = open_store(etcd.url(prefix=f"/one-index-{uuid.uuid4().hex[:12]}"))
    _fleet(store)
    now = datetime.now(UTC)
    tokens = {role: issue_token(store, role, manager="test", now=now, ttl=None, name=f"t-{role}")[1]
              for role in ("admin", "scheduler")}
    app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
    files = make_tls_files(d / "tls")
    with ServerThread(app, files) as server:
        yield server.url, files.ca, store, tokens, app.state.ctx
    store.close()


def test_in_serve_placement_and_fit_share_one_index_and_see_a_write_at_one_version(
    served: tuple[str, Path, Store, dict[str, str], Any],
) -> None:
    url, ca, store, tokens, ctx = served
    headers = {"X-Auth-Token": tokens["scheduler"], "OpenStack-API-Version": "placement 1.39"}

    def candidates() -> set[str]:
        r = requests.get(url + CANDIDATES, headers=headers, verify=str(ca), timeout=30)
        assert r.status_code == 200, r.text
        return set(r.json()["provider_summaries"])

    def fit() -> set[str]:
        r = requests.post(f"{url}{GV}/fit", json={"resources": {"cpu": "10"}}, verify=str(ca), timeout=30,
                          headers={"Authorization": f"Bearer {tokens['scheduler']}"})
        assert r.status_code in (200, 201), r.text
        return {c["name"] for c in r.json()["candidates"]}

    hv1, hv2 = (provider_uuid(store.get_hypervisor(n)) for n in ("hv1", "hv2"))
    # 10 VCPU fit on hv1 (16 free), not on hv2 (16 less 10 in use): both answers say so.
    assert candidates() == {hv1} and fit() == {"hv1"}
    snap = ctx.placement_snapshot()
    with ctx.index_lock:
        index = ctx.fleet_index()
    assert isinstance(index, FleetIndex) and snap.index is index  # one object
    if not store.events_at_hand:  # etcd: the index follows the process's one stream, as the snapshot does
        assert "fleet-index-stream" in {t.name for t in threading.enumerate()}
    h = index.host("hv1")
    assert isinstance(h, Hypervisor) and snap.fleet().providers[hv1].hypervisor is h
    _overcommit(store, "hv2", 2.0)  # 16 × 2 less 10: now 10 fit on hv2 too
    assert candidates() == {hv1, hv2}
    version = snap.index_version
    assert fit() == {"hv1", "hv2"}
    # fit's catch-up found nothing new: Placement already had this version of the index.
    assert index.placement_version == version
    assert snap.fleet().providers[hv2].hypervisor is index.host("hv2")


def test_after_the_index_reloads_the_snapshot_takes_every_root_again(tmp_path: Path) -> None:
    """A reload of the index (a watch that lost its history lists the store
    again) starts a new run of versions: a reader from before it is handed
    every root, and the snapshot's providers stay what they were."""
    store = open_store(f"sqlite:///{tmp_path}/h.db")
    _fleet(store)
    index = FleetIndex.from_store(store)
    snap = ProviderSnapshot.from_store(store, index=index)
    before = dict(snap.fleet().providers)
    version = snap.index_version
    assert version is not None
    now = datetime.now(UTC)
    assert index.placement_roots(version, now)[1] == {}  # nothing made since
    index.load_from(store)
    assert index.placement_roots(version, now)[1] is None  # from before the reload: take them all
    assert dict(snap.fleet().providers) == before
    assert snap.index_version == index.placement_version != version
    h = index.host("hv1")
    assert h is not None and snap.fleet().providers[provider_uuid(h)].hypervisor is h
    store.close()


def test_a_catch_up_of_the_index_starts_where_the_last_one_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Placement's writes are not of the index's kinds, yet each Placement
    request catches the index up: on SQLite a catch-up reads from the
    revision the last one reached, not from the index's last event (which
    walked every revision since, a whole fleet's seeding at 10k providers)."""
    store = open_store(f"sqlite:///{tmp_path}/h.db")
    _fleet(store)
    index = FleetIndex.from_store(store)
    sinces: list[int] = []
    real = store.watch

    def watch(kind: str | None = None, since: int = 0, **kw: Any) -> Any:
        sinces.append(since)
        return real(kind, since, **kw)

    monkeypatch.setattr(store, "watch", watch)
    reached = []
    for i in range(3):
        issue_token(store, "viewer", manager="test", now=datetime.now(UTC), ttl=None, name=f"v{i}")
        reached.append(store.revision())
        index.refresh(store)
    assert sinces[1:] == reached[:-1]
    _overcommit(store, "hv1", 2.0)  # one of its own kinds still comes
    index.refresh(store)
    assert sinces[-1] == reached[-1]
    h = index.host("hv1")
    assert h is not None and h.spec.overcommit["cpu"] == 2.0
    store.close()
