"""Writing the agent's status through the Store, safely.

- Only `status` is written, as manager `agent/<name>`; `spec` is whatever the
  store holds (the Hypervisor is created with an empty spec if missing).
- Every write is compare-and-swap on resourceVersion: the new status is built
  from the object just read, so a spec change that lands in between makes the
  write stale, and it is rebuilt against the new spec. An older status can
  never overwrite a newer one, because every attempt re-reads first.
- When nothing but the heartbeat would change, the write is skipped unless the
  stored heartbeat is older than `heartbeat_every` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from hvfleet.agent.reconcile import same_status
from hvfleet.model.errors import AlreadyExists, NotFound
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.meta import ObjectMeta
from hvfleet.store.base import StaleVersion, Store

Build = Callable[[Hypervisor], Hypervisor]


def agent_manager(name: str) -> str:
    return f"agent/{name}"


@dataclass(frozen=True)
class WriteResult:
    hypervisor: Hypervisor
    written: bool


class StatusWriter:
    def __init__(self, store: Store, name: str, heartbeat_every: float, attempts: int = 20) -> None:
        self.store = store
        self.name = name
        self.manager = agent_manager(name)
        self.heartbeat_every = heartbeat_every
        self.attempts = attempts

    def _heartbeat_due(self, current: Hypervisor, now: datetime) -> bool:
        last = current.status.last_heartbeat_time
        return last is None or (now - last).total_seconds() >= self.heartbeat_every

    def write(self, build: Build) -> WriteResult:
        """Apply `build` (stored object → object with new status) with CAS."""
        last_error: StaleVersion | AlreadyExists | None = None
        for _ in range(self.attempts):
            try:
                current = self.store.get_hypervisor(self.name)
            except NotFound:
                fresh = build(Hypervisor(metadata=ObjectMeta(name=self.name)))
                try:
                    created = self.store.create(fresh, self.manager)
                except AlreadyExists as exc:
                    last_error = exc
                    continue
                assert isinstance(created, Hypervisor)
                return WriteResult(created, True)
            new = build(current)
            if same_status(current, new) and not self._heartbeat_due(
                current, datetime.now(UTC)
            ):
                return WriteResult(current, False)
            try:
                updated = self.store.update(new, self.manager)
            except StaleVersion as exc:
                last_error = exc
                continue
            assert isinstance(updated, Hypervisor)
            return WriteResult(updated, True)
        assert last_error is not None
        raise last_error
