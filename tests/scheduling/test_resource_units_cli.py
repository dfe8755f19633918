"""Byte resources other than memory read as bytes in the scheduling commands too
(ResourceName.counts_bytes), through the real `hvfleet` entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sched_fleet import host, now, put_host

from hvfleet.store import open_store


def test_fit_shows_free_disk_and_hugepages_in_binary_suffixes(
    tmp_path: Path, monkeypatch: Any, run: Any
) -> None:
    url = f"sqlite:///{tmp_path}/hvfleet.db"
    monkeypatch.setenv("HVFLEET_STORE", url)
    with open_store(url) as s:
        put_host(s, host("hv-a", {"cpu": 8, "memory": "32Gi", "disk": "500Gi", "hugepages-2Mi": "1Gi",
                                  "VGPU": 4}, beat=now()))
    r = run("fit", "--cpu", "1", "--resource", "disk=10Gi", "-o", "json")
    assert r.code == 0, r.err
    free = json.loads(r.out)["candidates"][0]["free"]
    assert free == {"VGPU": "4", "cpu": "8", "disk": "500Gi", "hugepages-2Mi": "1Gi", "memory": "32Gi"}
