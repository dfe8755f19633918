"""Writing the agent's status through the Store, safely.

- Only `status` is written, as manager `agent/<name>`; `spec` is whatever the
  store holds (a missing Hypervisor is first created bare, with an empty spec).
- Every write is compare-and-swap on resourceVersion: the new status is built
  from the object just read, so a spec change that lands in between makes the
  write stale, and it is rebuilt against the new spec. An older status can
  never overwrite a newer one, because every attempt re-reads first.
- When nothing but the heartbeat would change, the write is skipped, except on
  the agent's periodic resync (one heartbeat per resync period) or when the
  stored heartbeat is older than `heartbeat_every` seconds (during an outage).
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
from hvfleet.store.ownership import agent_manager

Build = Callable[[Hypervisor], Hypervisor]


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

    def write(self, build: Build, *, heartbeat: bool = False) -> WriteResult:
        """Apply `build` (stored object → object with new status) with CAS. An
        unchanged status is written only with `heartbeat` (the agent's resync
        pass) or when the stored heartbeat is older than `heartbeat_every`."""
        last_error: StaleVersion | AlreadyExists | NotFound | None = None
        for _ in range(self.attempts):
            try:
                current = self.store.get_hypervisor(self.name)
            except NotFound:
                # Create it bare, then write status like any update: status is built
                # against the stored object (generation, spec), never an imagined one.
                try:
                    self.store.create(Hypervisor(metadata=ObjectMeta(name=self.name)), self.manager)
                except AlreadyExists as exc:
                    last_error = exc
                continue
            new = build(current)
            if (
                not heartbeat
                and same_status(current, new)
                and not self._heartbeat_due(current, datetime.now(UTC))
            ):
                return WriteResult(current, False)
            try:
                updated = self.store.update(new, self.manager)
            except (StaleVersion, NotFound) as exc:
                # Changed or deleted since we read it: rebuild against what is there now.
                last_error = exc
                continue
            assert isinstance(updated, Hypervisor)
            return WriteResult(updated, True)
        assert last_error is not None
        raise last_error
