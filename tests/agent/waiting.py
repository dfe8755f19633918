"""Polling the store until a hypervisor's status shows what a test waits for.

Shared by the pytest tests of this package and by embed_scenarios.py, which
runs in a child process of its own."""

from __future__ import annotations

import time
from collections.abc import Callable

from hvfleet.model import Hypervisor, NotFound
from hvfleet.store.base import Store


def wait_for(
    store: Store,
    name: str,
    pred: Callable[[Hypervisor], bool],
    timeout: float,
    tolerate: tuple[type[Exception], ...] = (NotFound,),
) -> tuple[float, Hypervisor]:
    """Seconds until `pred` holds for the stored Hypervisor (AssertionError on
    timeout); errors of the `tolerate` kinds count as "not there yet"."""
    start = time.monotonic()
    last: Hypervisor | None = None
    while time.monotonic() - start < timeout:
        try:
            last = store.get_hypervisor(name)
        except tolerate:
            last = None
        if last is not None and pred(last):
            return time.monotonic() - start, last
        time.sleep(0.01)
    seen = last.status.to_dict() if last else {}
    brief = {k: seen.get(k) for k in ("allocation", "effectiveCapacity", "instances", "conditions")}
    raise AssertionError(f"not within {timeout}s; last status: {brief}")
