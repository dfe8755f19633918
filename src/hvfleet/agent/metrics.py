"""The agent's Prometheus metrics, on its own registry (several agents can run
in one test process without clashing), served at `--metrics-addr`."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor, ResourceList

# Reconciles take milliseconds; a 500-domain host tens of them.
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def parse_listen_address(text: str) -> tuple[str, int]:
    """'127.0.0.1:9177' → ('127.0.0.1', 9177); '[::1]:9177' for IPv6."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdecimal() or not 0 <= int(port) <= 65535:
        raise InvalidInput(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9177)", field="metrics_addr")
    return host, int(port)


# The metrics with one series per hypervisor, which `bind` shows at 0 from the
# start: attribute → (type, name, help).
_PER_HOST: dict[str, tuple[type[Counter] | type[Gauge], str, str]] = {
    "reconnects": (Counter, "hvfleet_agent_libvirt_reconnects", "Successful reconnects to libvirt"),
    "connected": (Gauge, "hvfleet_agent_libvirt_connected", "1 while the agent is connected to libvirt"),
    "skipped_domains": (Gauge, "hvfleet_agent_skipped_domains",
                        "Domains left out because they cannot be parsed"),
    "store_errors": (Counter, "hvfleet_agent_store_errors", "Status writes that failed and will be retried"),
}


class AgentMetrics:
    # Made from _PER_HOST.
    reconnects: Counter
    connected: Gauge
    skipped_domains: Gauge
    store_errors: Counter

    def __init__(self, hypervisor: str) -> None:
        self.hypervisor = hypervisor
        self.registry = CollectorRegistry()
        labels = ["hypervisor", "resource"]
        self.capacity = Gauge(
            "hvfleet_hypervisor_capacity", "Physical capacity (status.capacity)",
            labels, registry=self.registry,
        )
        self.allocation = Gauge(
            "hvfleet_hypervisor_allocation", "Used by counted domains (status.allocation)",
            labels, registry=self.registry,
        )
        self.effective = Gauge(
            "hvfleet_hypervisor_effective_capacity",
            "Capacity under spec overcommit and reserve (status.effectiveCapacity)",
            labels, registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "hvfleet_agent_reconcile_duration_seconds",
            "Time to read libvirt, rebuild status and write it",
            ["hypervisor"], buckets=_DURATION_BUCKETS, registry=self.registry,
        )
        for attribute, (metric, name, documentation) in _PER_HOST.items():
            setattr(self, attribute, metric(name, documentation, ["hypervisor"], registry=self.registry))
        self.guest_crashes = Counter(
            "hvfleet_guest_crashes",
            "Guest crashes (libvirt lifecycle CRASHED: pvpanic, Hyper-V crash MSRs), "
            "recorded in status.instances[].crashCount",
            ["hypervisor", "domain"], registry=self.registry,
        )
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def bind(self, hypervisor: str) -> None:
        """Name the hypervisor once it is known; counters show 0 from then on."""
        self.hypervisor = hypervisor
        for attribute in _PER_HOST:
            getattr(self, attribute).labels(hypervisor)

    def _set(self, gauge: Gauge, values: ResourceList) -> None:
        for r, q in values.items():
            gauge.labels(self.hypervisor, str(r)).set(float(q.value))

    def observe_status(self, h: Hypervisor, skipped: int) -> None:
        self._set(self.capacity, h.status.capacity)
        self._set(self.allocation, h.status.allocation)
        self._set(self.effective, h.status.effective_capacity)
        self.skipped_domains.labels(self.hypervisor).set(skipped)

    def serve(self, address: str) -> tuple[str, int]:
        """Start serving /metrics; returns the bound (host, port) (port 0 picks one)."""
        host, port = parse_listen_address(address)
        try:
            self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            raise InvalidInput(f"{address}: cannot listen: {exc.strerror}", field="metrics_addr") from None
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
