"""The long-running node agent: keeps one Hypervisor's status true.

Three sources wake the reconcile loop:
- libvirt lifecycle events (define, undefine, start, stop, ...), and tunable
  (pinning, numatune) and device added/removed events: a burst is
  debounced (`debounce` seconds of quiet, at most `max_delay` after the first
  event), then domains are re-read and status rewritten;
- the store watch on its own object: a spec change (overcommit, reserve) or a
  label change (which policies select it) recomputes effectiveCapacity from
  the last observation, without libvirt; so does any OvercommitPolicy change
  (a second watch, on that kind: through the API, an agent token reads and
  watches only the policies that select its own host);
- the resync timer: every `resync` seconds everything, host facts included,
  is re-read, which catches any event that was missed.

Faults: when libvirt goes away (close callback, or any call failing) the agent
writes `LibvirtConnected=False`, reconnects with capped exponential backoff and
resyncs fully. When the store is unreachable it keeps observing and retries the
write with backoff; the write is CAS-protected and rebuilt from the newest
observation, so nothing older ever lands. When the policies cannot be read,
the status keeps its last effectiveCapacity with `Synced=False` (never ratio 1
guessed), and the write is retried with the same backoff until they can.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from pydantic import ValidationError

from hvfleet.agent.backoff import Backoff
from hvfleet.agent.metrics import AgentMetrics
from hvfleet.agent.observe import HostFacts, observe
from hvfleet.agent.reconcile import (
    CRASH_REASONS,
    CRASHED_EVENT,
    CapabilitiesParser,
    CrashEvent,
    DomainParseCache,
    Facts,
    Policies,
    Unresolved,
    digest,
    mark_disconnected,
    mark_unreadable_host,
    reconcile,
)
from hvfleet.agent.status_writer import StatusWriter, WriteResult
from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.discovery.libvirt_conn import LibvirtConnection, node_file_of_test_uri
from hvfleet.model.bounds import MAX_LEASE_SECONDS
from hvfleet.model.errors import Gone, HvfleetError, InvalidInput, Unavailable
from hvfleet.model.hypervisor import CountMode, Hypervisor, HypervisorSpec, OvercommitPolicy
from hvfleet.model.kinds import hypervisor_name_error
from hvfleet.model.meta import validation_message
from hvfleet.model.readiness import DEFAULT_RESYNC
from hvfleet.store.base import Store

log = logging.getLogger(__name__)

# Longest the main loop waits at once, so that a stop signal is seen this soon.
_SIGNAL_SLICE_S = 0.5


def checked_name(name: str) -> str:
    why = hypervisor_name_error(name)
    if why is not None:
        raise InvalidInput(why, field="name")
    return name


def default_name(uri: str, libvirt_hostname: str) -> str:
    """The Hypervisor name: libvirt's host name, lower-cased. For a test-driver
    node file it is the file's stem, because the test driver answers every
    connection with the real machine's host name, not the simulated host's."""
    node_file = node_file_of_test_uri(uri)
    raw = Path(node_file).stem if node_file else libvirt_hostname
    name = raw.strip().lower()
    if hypervisor_name_error(name) is not None:
        raise InvalidInput(
            f"the host name {raw!r} from {uri} is not a valid hypervisor name; name the hypervisor",
            field="name",
        )
    return name


def usable_dump_location(path: str | None) -> str | None:
    """`path` if it is a directory this process can write into, else None."""
    if path and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK):
        return os.path.abspath(path)
    return None


class StatusRefused(HvfleetError):
    """The observed status cannot be stored; the host was marked not Ready."""


@dataclass(frozen=True)
class AgentConfig:
    uri: str
    name: str | None = None
    count: CountMode = "defined"
    # Readers judge staleness in these periods (model.readiness.DEFAULT_STALENESS).
    resync: float = DEFAULT_RESYNC.total_seconds()
    debounce: float = 0.05
    max_delay: float = 0.25
    backoff_initial: float = 0.25
    backoff_cap: float = 10.0
    # The liveness Lease (hvfleet.model.lease, every backend): renewed every
    # lease_ttl/3 seconds, so readers see the host NotReady at most lease_ttl
    # seconds after the agent stops. 0: no Lease; the status heartbeat on every
    # resync is then the only sign of life (as before leases).
    lease_ttl: int = 30
    # With a Lease, an unchanged status is rewritten only this often (kubelet's
    # nodeStatusReportFrequency is 5 minutes too): the Lease is the heartbeat.
    status_resync: float = 300.0
    # The host's guest core dump directory (qemu.conf auto_dump_path), if the
    # operator names one; reported in hostCapabilities.dumpLocation while it is
    # a writable directory, so the guest generator may choose a dumping on_crash.
    dump_location: str | None = None


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        store: Store,
        metrics: AgentMetrics | None = None,
        capabilities_parser: CapabilitiesParser | None = None,
    ) -> None:
        if config.resync <= 0:
            raise InvalidInput(f"{config.resync} must be greater than 0", field="resync")
        if not 0 <= config.lease_ttl <= MAX_LEASE_SECONDS:
            # A longer Lease is refused by the store at its first renewal, and
            # the next one comes a third of it later: no Lease for hours.
            raise InvalidInput(f"{config.lease_ttl} seconds: must be from 0 (no Lease) to "
                               f"{MAX_LEASE_SECONDS} (a day)", field="lease_ttl")
        if config.status_resync <= 0:
            raise InvalidInput(f"{config.status_resync} must be greater than 0", field="status_resync")
        self.config = config
        self.store = store
        self.metrics = metrics
        self.capabilities_parser = capabilities_parser or parse_host_capabilities
        self.conn = LibvirtConnection(config.uri)
        self.name: str | None = checked_name(config.name) if config.name is not None else None
        self.writer: StatusWriter | None = None
        self.facts: Facts | None = None
        self.last: Hypervisor | None = None
        self._host: HostFacts | None = None
        self._cache = DomainParseCache()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._libvirt_dirty = False
        self._spec_dirty = False
        self._closed = False
        self._write_pending = False
        self._first_event_at: float | None = None
        self._last_event_at = 0.0
        self._last_spec: HypervisorSpec | None = None
        self._last_skipped: tuple[tuple[str, str], ...] = ()
        self._policies_error: str | None = None  # the last read's failure, to warn on change
        self.unresolved = False  # the last status write could not resolve its ratios
        # Crash events not yet in a written status (guarded by _lock).
        self._crashes: list[CrashEvent] = []
        # The resourceVersions of this agent's own recent status writes, and
        # when it last warned of another agent's (`_another_writer`).
        self._written: deque[str | None] = deque(maxlen=256)
        self._suspects: deque[tuple[str | None, float]] = deque(maxlen=256)
        self._foreign_writes = 0
        self._warned_other_writer = -math.inf
        self._dump_ok: bool | None = None  # last dump location check, to warn on change
        self.reconnects = 0
        # libvirt passes and status writes, for tests and benchmarks
        self.observations = 0
        self.reconciles = 0
        self._ensure_writer()

    # -- connection ------------------------------------------------------------------------

    def connect(self) -> None:
        """Open libvirt, subscribe to events, and settle the Hypervisor name."""
        self.conn.close()
        self.conn.open()
        try:
            self.conn.on_lifecycle(self._on_lifecycle)
            self.conn.on_resource_change(lambda uuid: self._on_lifecycle(uuid, -1, -1))
            self.conn.on_close(self._on_close)
            if self.name is None:
                self.name = default_name(self.config.uri, self.conn.hostname())
        except BaseException:
            self.conn.close()
            raise
        with self._lock:
            self._closed = False
            self._host = None  # host facts are re-read after every (re)connect
        self._ensure_writer()

    def _ensure_writer(self) -> None:
        """The status writer, once the Hypervisor's name is known (from --name at
        once, else from libvirt's answer): an outage at start is recorded too."""
        if self.writer is None and self.name is not None:
            # With a Lease to prove liveness, an unchanged status waits for the slow
            # status resync; without one, every resync carries the heartbeat.
            every = self.config.status_resync if self.leasing else self.config.resync
            self.writer = StatusWriter(self.store, self.name, every)
            if self.metrics is not None:
                self.metrics.bind(self.name)

    @property
    def leasing(self) -> bool:
        return self.config.lease_ttl > 0

    def _on_lifecycle(self, uuid: str, event: int, detail: int) -> None:
        now = time.monotonic()
        with self._lock:
            if event == CRASHED_EVENT and uuid:
                reason = CRASH_REASONS.get(detail, f"detail {detail}")
                log.warning("guest %s crashed (%s)", uuid, reason)
                self._crashes.append(CrashEvent(uuid, datetime.now(UTC), reason))
            self._libvirt_dirty = True
            self._last_event_at = now
            if self._first_event_at is None:
                self._first_event_at = now
        self._wake.set()

    def _on_close(self, reason: int) -> None:
        log.warning("libvirt %s closed the connection (reason %d)", self.config.uri, reason)
        with self._lock:
            self._closed = True
        self._wake.set()

    # -- one pass --------------------------------------------------------------------------

    def observe(self, full: bool) -> Facts:
        """Read libvirt (host facts too when `full`) and parse it. Unavailable if
        libvirt fails; InvalidInput if the host's own XML cannot be parsed."""
        with self._lock:
            self._libvirt_dirty = False
            self._first_event_at = None
            host = None if full else self._host
            self.observations += 1
        obs, host = observe(self.conn, host)
        facts = digest(obs, self.config.count, self.capabilities_parser, self._cache)
        dump = usable_dump_location(self.config.dump_location)
        if self.config.dump_location and dump is None and self._dump_ok is not False:
            log.warning("dump location %s is not a writable directory: not reported",
                        self.config.dump_location)
        self._dump_ok = dump is not None
        facts = replace(facts, dump_location=dump)
        if facts.skipped != self._last_skipped:  # warn on change, not on every pass
            for name, reason in facts.skipped:
                log.warning("skipping domain %s: %s", name, reason)
            self._last_skipped = facts.skipped
        with self._lock:
            self._host = host
            self.facts = facts
        return facts

    def write(
        self, build: Callable[[Hypervisor], Hypervisor], heartbeat: bool = False
    ) -> WriteResult:
        assert self.writer is not None
        result = self.writer.write(build, heartbeat=heartbeat)
        with self._lock:
            self._written.append(result.hypervisor.metadata.resource_version)
        self.last = result.hypervisor
        self._last_spec = result.hypervisor.spec
        if self.metrics is not None:
            self.metrics.observe_status(
                result.hypervisor, len(self.facts.skipped) if self.facts else 0
            )
        return result

    def policies(self) -> Policies:
        """The OvercommitPolicies the store shows this agent, read for every status
        write (a handful of small objects); `Unresolved` if the read fails: no
        ratio is guessed, the status keeps its last effectiveCapacity."""
        try:
            policies: tuple[OvercommitPolicy, ...] = tuple(self.store.list_overcommit_policies())
        except HvfleetError as exc:
            if str(exc) != self._policies_error:  # warn on change, not on every retry
                log.warning("cannot read the overcommit policies; status.effectiveCapacity "
                            "stays the last one resolved (condition Synced=False): %s", exc)
            self._policies_error = str(exc)
            self.unresolved = True
            return Unresolved(str(exc))
        if self._policies_error is not None:
            log.info("overcommit policies readable again")
        self._policies_error = None
        self.unresolved = False
        return policies

    def write_facts(self, heartbeat: bool = False) -> WriteResult:
        facts = self.facts
        assert facts is not None
        with self._lock:
            crashes = tuple(self._crashes)
        # A CAS retry rebuilds from the newest stored status, so the same
        # pending crashes are added exactly once to whatever was stored.
        policies = self.policies()
        with_crashes = replace(facts, crashes=crashes, policies=policies)
        try:
            result = self.write(lambda h: reconcile(h, with_crashes, datetime.now(UTC)), heartbeat)
        except (InvalidInput, ValidationError) as exc:
            # What libvirt shows cannot be stored (past a bound of the status:
            # more guests or cells than it lists, an amount out of range). The
            # host must not stay Ready on its last numbers: the last stored
            # observation is kept, not Ready, saying why.
            why = (validation_message(exc, "status") if isinstance(exc, ValidationError)
                   else str(exc))
            message = f"this host's status cannot be stored: {why}"
            log.error("%s: %s", self.name, message)
            self.write(partial(mark_unreadable_host, message=message, now=datetime.now(UTC),
                               policies=policies, reason="StatusRefused"), heartbeat=True)
            raise StatusRefused(message) from None
        if crashes:
            with self._lock:
                del self._crashes[: len(crashes)]
            if self.metrics is not None:
                names = {i.uuid: i.name for i in result.hypervisor.status.instances}
                for c in crashes:
                    self.metrics.guest_crashes.labels(self.name, names.get(c.uuid, c.uuid)).inc()
        return result

    def write_disconnected(self, message: str) -> WriteResult | None:
        if self.writer is None:
            return None  # name unknown until libvirt answered once
        uri = self.config.uri
        policies = self.policies()
        return self.write(lambda h: mark_disconnected(h, uri, message, datetime.now(UTC), policies))

    def run_once(self) -> Hypervisor:
        """Connect, observe, write status once. Unavailable if libvirt is unreachable."""
        try:
            self.connect()
            started = time.monotonic()
            self.observe(full=True)
            result = self.write_facts(heartbeat=True)
            if self.metrics is not None:
                self.metrics.reconcile_seconds.labels(self.name).observe(
                    time.monotonic() - started
                )
            return result.hypervisor
        finally:
            self.conn.close()

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until `stop` is set. Returns within a fraction of a second of it."""
        watcher: threading.Thread | None = None
        libvirt_backoff = Backoff(self.config.backoff_initial, self.config.backoff_cap)
        store_backoff = Backoff(self.config.backoff_initial, self.config.backoff_cap)
        connected_once = False
        next_resync = 0.0
        retry_write_at: float | None = None
        heartbeat_pending = False
        next_status_resync = 0.0
        # Wakes the loop when stop is set, whatever it is waiting for.
        def wake_on_stop() -> None:
            stop.wait()
            self._wake.set()

        stopper = threading.Thread(target=wake_on_stop, name="agent-stop", daemon=True)
        stopper.start()
        try:
            while not stop.is_set():
                with self._lock:
                    closed = self._closed
                if closed or not self.conn.is_open:
                    if not self._reconnect(stop, libvirt_backoff):
                        continue
                    if connected_once:
                        self.reconnects += 1
                        if self.metrics is not None:
                            self.metrics.reconnects.labels(self.name).inc()
                    connected_once = True
                    libvirt_backoff.reset()
                    next_resync = 0.0  # full resync after every (re)connect
                    if watcher is None:
                        watcher = threading.Thread(
                            target=self._watch_spec, args=(stop,), name="agent-spec-watch",
                            daemon=True,
                        )
                        watcher.start()
                        if self.leasing:
                            threading.Thread(
                                target=self._keep_lease, args=(stop,), name="agent-lease",
                                daemon=True,
                            ).start()
                        threading.Thread(
                            target=self._watch_policies, args=(stop,), name="agent-policy-watch",
                            daemon=True,
                        ).start()
                    if self.metrics is not None:
                        self.metrics.connected.labels(self.name).set(1)

                now = time.monotonic()
                deadlines = [next_resync]
                if retry_write_at is not None:
                    deadlines.append(retry_write_at)
                # In slices: Python runs a signal handler (SIGTERM → stop) only in the
                # main thread, and a signal the kernel hands to another thread (the
                # libvirt event loop's, a watch's) does not interrupt this wait.
                self._wake.wait(min(max(0.0, min(deadlines) - now), _SIGNAL_SLICE_S))
                if stop.is_set():
                    break
                self._wake.clear()
                self._debounce(stop)

                now = time.monotonic()
                with self._lock:
                    closed, libvirt_dirty, spec_dirty = (
                        self._closed, self._libvirt_dirty, self._spec_dirty
                    )
                    self._spec_dirty = False
                if closed:
                    continue
                full = now >= next_resync
                started = time.monotonic()
                try:
                    if full or libvirt_dirty or self.facts is None:
                        self.observe(full=full or self.facts is None)
                        self._write_pending = True
                        # A resync pass carries the heartbeat, changed or not: every
                        # one without a Lease, one per status resync with a Lease.
                        if full and (not self.leasing or now >= next_status_resync):
                            heartbeat_pending = True
                            next_status_resync = now + self.config.status_resync
                    elif spec_dirty:
                        self._write_pending = True
                except Unavailable as exc:
                    self._lost(str(exc))
                    continue
                except InvalidInput as exc:
                    # The host's own XML is unreadable: nothing trustworthy to write
                    # but the fact itself. Try again at the next resync.
                    log.error("%s", exc)
                    self._safe_write(partial(mark_unreadable_host, message=str(exc),
                                             now=datetime.now(UTC), policies=self.policies()))
                    next_resync = now + self.config.resync
                    continue
                if full:
                    next_resync = now + self.config.resync
                if self._write_pending and (retry_write_at is None or now >= retry_write_at):
                    if self._try_write(store_backoff, heartbeat_pending):
                        retry_write_at = None
                        heartbeat_pending = False
                        if self.unresolved:  # written with Synced=False: read them again soon
                            self._write_pending = True
                            retry_write_at = time.monotonic() + store_backoff.next_delay()
                        if self.metrics is not None:
                            self.metrics.reconcile_seconds.labels(self.name).observe(
                                time.monotonic() - started
                            )
                    else:
                        retry_write_at = time.monotonic() + store_backoff.next_delay()
        finally:
            self.conn.close()
            if self.metrics is not None and self.name is not None:
                self.metrics.connected.labels(self.name).set(0)

    def _try_write(self, store_backoff: Backoff, heartbeat: bool) -> bool:
        try:
            self.write_facts(heartbeat)
        except HvfleetError as exc:
            log.warning("status write for %s failed, will retry: %s", self.name, exc)
            if self.metrics is not None and self.name is not None:
                self.metrics.store_errors.labels(self.name).inc()
            return False
        except Exception as exc:  # a store backend's own error (e.g. sqlite3) must not kill us
            log.warning("status write for %s failed, will retry: %s", self.name, exc)
            return False
        self._write_pending = False
        if not self.unresolved:
            store_backoff.reset()
        self.reconciles += 1
        return True

    def _lost(self, message: str) -> None:
        log.warning("%s", message)
        with self._lock:
            self._closed = True
        self.conn.close()
        if self.metrics is not None and self.name is not None:
            self.metrics.connected.labels(self.name).set(0)
        self._safe_write_disconnected(message)

    def _safe_write_disconnected(self, message: str) -> None:
        try:
            self.write_disconnected(message)
        except Exception as exc:
            log.warning("cannot record the libvirt outage in the store: %s", exc)

    def _safe_write(self, build: Callable[[Hypervisor], Hypervisor]) -> None:
        try:
            self.write(build)
        except Exception as exc:
            log.warning("status write for %s failed: %s", self.name, exc)

    def _reconnect(self, stop: threading.Event, backoff: Backoff) -> bool:
        try:
            self.connect()
            return True
        except Unavailable as exc:
            self._safe_write_disconnected(str(exc))
            delay = backoff.next_delay()
            log.info("reconnecting to %s in %.2fs", self.config.uri, delay)
            stop.wait(delay)
            return False

    def _debounce(self, stop: threading.Event) -> None:
        """After an event, wait until `debounce` seconds pass without another, but no
        longer than `max_delay` after the first."""
        while not stop.is_set():
            with self._lock:
                first, last = self._first_event_at, self._last_event_at
            if first is None:
                return
            now = time.monotonic()
            quiet_at = last + self.config.debounce
            latest = first + self.config.max_delay
            until = min(quiet_at, latest)
            if now >= until:
                return
            stop.wait(until - now)

    # -- liveness lease --------------------------------------------------------------------

    def _keep_lease(self, stop: threading.Event) -> None:
        """Renew the liveness Lease on its own thread, so neither a slow libvirt nor
        a status-write backoff can let it lapse while the agent is alive. It is a
        small object of its own: an idle host does not rewrite its status."""
        assert self.name is not None
        every = max(self.config.lease_ttl / 3, 0.2)
        while not stop.is_set():
            try:
                self.store.keepalive(self.name, self.config.lease_ttl)
            except Exception as exc:
                log.warning("renewing the liveness lease of %s failed, will retry: %s", self.name, exc)
            stop.wait(every)

    # -- spec watch ------------------------------------------------------------------------

    def _watch_spec(self, stop: threading.Event) -> None:
        backoff = Backoff(self.config.backoff_initial, self.config.backoff_cap)
        since: int | None = None
        # The labels of the last event seen, not of the agent's last write: a write
        # answered after a relabel carries the new labels, though its ratios were
        # resolved for the old ones, and the relabel's own event must still count.
        labels: dict[str, str] | None = None
        status: object | None = None  # the status of the last event seen
        while not stop.is_set():
            try:
                if since is None:
                    since = self.store.revision()
                    self._spec_changed()  # anything between our write and `since`
                # One long-lived stream: no idle timeout, so an idle agent does not
                # open a new etcd watch every second (2,000 agents would make that
                # 2,000 watch creations per second).
                for ev in self.store.watch("Hypervisor", since=since, name=self.name, stop=stop):
                    since = ev.revision
                    obj = ev.object
                    if not isinstance(obj, Hypervisor) or obj.metadata.name != self.name:
                        continue
                    self._another_writer(obj, status)
                    status = obj.status
                    # Labels decide which policies select this host.
                    relabelled = labels is not None and obj.metadata.labels != labels
                    labels = dict(obj.metadata.labels)
                    if ev.type == "DELETED" or obj.spec != self._last_spec or relabelled:
                        self._spec_changed()
                backoff.reset()
            except Gone:
                since = None
            except Exception as exc:
                log.warning("watching %s in the store failed, will retry: %s", self.name, exc)
                since = None
                stop.wait(backoff.next_delay())

    def _another_writer(self, obj: Hypervisor, status_before: object | None) -> None:
        """Only `agent/<name>` writes this host's status (the store's rule), so
        a status change this agent did not write is another agent's started
        with the same --name: the two overwrite each other at every pass.
        Said once a minute (each can only see the other's writes)."""
        now = time.monotonic()
        with self._lock:
            # A write's event can come before the writer noted its version:
            # judged a second later, at a later event.
            while self._suspects and now - self._suspects[0][1] >= 1.0:
                version, _ = self._suspects.popleft()
                if version not in self._written:
                    self._foreign_writes += 1
            if status_before is not None and obj.status != status_before:
                self._suspects.append((obj.metadata.resource_version, now))
            foreign, self._foreign_writes = self._foreign_writes, 0
        if not foreign:
            return
        if now - self._warned_other_writer >= 60:
            self._warned_other_writer = now
            log.error("another agent writes the status of %s (a second agent started under this "
                      "host's name?): the two overwrite each other", self.name)
        if self.metrics is not None:
            self.metrics.store_errors.labels(self.name).inc(foreign)

    def _watch_policies(self, stop: threading.Event) -> None:
        """Any OvercommitPolicy change may change this host's effective capacity:
        rebuild the status (the write is skipped when nothing changed)."""
        backoff = Backoff(self.config.backoff_initial, self.config.backoff_cap)
        since: int | None = None
        while not stop.is_set():
            try:
                if since is None:
                    since = self.store.revision()
                    self._spec_changed()
                for ev in self.store.watch("OvercommitPolicy", since=since, stop=stop):
                    since = ev.revision
                    self._spec_changed()
                backoff.reset()
            except Gone:
                since = None
            except Exception as exc:
                log.warning("watching overcommit policies failed, will retry: %s", exc)
                since = None
                stop.wait(backoff.next_delay())

    def _spec_changed(self) -> None:
        with self._lock:
            self._spec_dirty = True
        self._wake.set()
