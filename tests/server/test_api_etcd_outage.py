"""The API over etcd while etcd is down: 503 ServiceUnavailable Statuses (no
other 5xx), and after etcd is back the same server serves again and a watch
opened before the outage sees writes made after it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.server.conftest import Api
from tests.server.objects import HV, hypervisor, status_of
from tests.server.watching import Watcher, names
from tests.support.etcd_local import EtcdCluster


def test_etcd_outage_is_503_and_the_server_recovers(make_api: Callable[..., Api], tmp_path: Path) -> None:
    # Its own member: stopping the shared one would take other tests down.
    with EtcdCluster(tmp_path / "etcd", size=1) as cluster:
        api = make_api(store_url=cluster.url(prefix="/outage"))
        c = api.client()
        assert c.post(HV, json=hypervisor("hv0")).status_code == 201
        rv = c.get(HV).json()["metadata"]["resourceVersion"]
        w = Watcher(api, {"resourceVersion": rv})
        cluster.kill_all()
        for call in (lambda: c.get(f"{HV}/hv0"), lambda: c.get(HV),
                     lambda: c.post(HV, json=hypervisor("hv1")),
                     lambda: c.patch(f"{HV}/hv0", {"spec": {"maintenance": "drain"}})):
            r = call()
            status_of(503, "ServiceUnavailable", r.json())
        cluster.start()
        deadline = time.monotonic() + 60
        while True:
            r = c.post(HV, json=hypervisor("hv2"))
            if r.status_code == 201:
                break
            assert r.status_code in (503, 409) and time.monotonic() < deadline, r.text
            time.sleep(0.5)
        w.wait_for(lambda ev: ("ADDED", "hv2") in names(ev), timeout=60)
        w.close()
