"""The real `hvfleet agent` keeps status.effectiveCapacity equal to what every
reader computes when an OvercommitPolicy is created, shadowed by the host's
own spec, and deleted, and when the host is relabelled out of and into it: the
agent watches the policies too, and its own labels."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from hvfleet.store import open_store

from .conftest import GI, fleet_uri, hvfleet, start_agent, stop, wait_for

POLICY = """\
apiVersion: hvfleet.io/v1
kind: OvercommitPolicy
metadata: {name: compute-default}
spec:
  selector: {matchExpressions: [{key: role, operator: In, values: [compute]}]}
  overcommit: {cpu: 3, memory: 1.25}
"""


def readers_effective(url: str) -> dict[str, str]:
    out = hvfleet("capacity", "-o", "json", "--store", url)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["hosts"][0]["effective"]  # type: ignore[no-any-return]


def test_status_effective_capacity_follows_policies_and_agrees_with_readers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hv.db'}"
    agent = start_agent("--connect", fleet_uri("compute-01"), "--store", url, "--resync", "60s")
    try:
        with open_store(url) as store:
            wait_for(store, "compute-01", lambda h: bool(h.status.capacity), 20)
            (tmp_path / "label.yaml").write_text(
                "apiVersion: hvfleet.io/v1\nkind: Hypervisor\n"
                "metadata: {name: compute-01, labels: {role: compute}}\n"
            )
            assert hvfleet("apply", "-f", str(tmp_path / "label.yaml"), "--store", url).returncode == 0
            (tmp_path / "policy.yaml").write_text(POLICY)
            assert hvfleet("apply", "-f", str(tmp_path / "policy.yaml"), "--store", url).returncode == 0
            # 32 CPUs × 3; 128Gi × 1.25 (two 64Gi cells: 80Gi each) — within 2 s, not at the 60 s resync.
            _, h = wait_for(store, "compute-01", lambda h: h.status.effective_capacity["cpu"] == 96, 2.0)
            assert h.status.effective_capacity["memory"] == 160 * GI
            assert [c.effective_capacity["memory"] for c in h.status.cells] == [80 * GI] * 2
            assert readers_effective(url) == {"cpu": "96", "memory": "160Gi"}

            # The host's own ratio shadows the policy's, for that resource only.
            assert hvfleet("overcommit", "set", "compute-01", "cpu=2", "--store", url).returncode == 0
            _, h = wait_for(store, "compute-01", lambda h: h.status.effective_capacity["cpu"] == 64, 2.0)
            assert h.status.effective_capacity["memory"] == 160 * GI
            assert readers_effective(url) == {"cpu": "64", "memory": "160Gi"}

            # Relabelled out of the policy and back: its labels decide, within the same 2 s.
            # (labels set as an operator's client would, leaving spec alone: a manifest
            # applied without spec.overcommit would take back the ratio set above)
            for role, memory in (("edge", 128), ("compute", 160)):
                h = store.get_hypervisor("compute-01")
                meta = h.metadata.model_copy(update={"labels": {"role": role}})
                store.update(h.model_copy(update={"metadata": meta}), "ops")
                _, h = wait_for(
                    store, "compute-01", lambda h, m=memory: h.status.effective_capacity["memory"] == m * GI,
                    2.0,
                )
                assert h.status.effective_capacity["cpu"] == 64  # its own ratio stays

            assert hvfleet("delete", "overcommitpolicy", "compute-default", "--store", url).returncode == 0
            _, h = wait_for(
                store, "compute-01", lambda h: h.status.effective_capacity["memory"] == 128 * GI, 2.0
            )
            assert readers_effective(url) == {"cpu": "64", "memory": "128Gi"}
    finally:
        rc, _, err = stop(agent, signal.SIGTERM)
    assert rc == 0, err
