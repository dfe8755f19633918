"""`GET /metrics` on `hvfleet serve`: the fleet's capacity as Prometheus gauges,
read at scrape time from the dashboard's live picture (live.FleetState), so a
Prometheus keeps the long history the server's bounded ring buffers do not.
Every value is the core's (the host's HostCapacity and what its reservations
hold); a scrape needs a bearer token allowed to list hypervisors.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from hvfleet.model.readiness import READINESS_STATES
from hvfleet.server.context import ApiContext
from hvfleet.server.dashboard.live import FleetState
from hvfleet.server.guard import authenticate
from hvfleet.server.identity import Action
from hvfleet.server.store_metrics import StoreCollector


class FleetCollector(Collector):
    def __init__(self, state: FleetState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        labels = ["hypervisor", "resource"]
        families = {
            "effective": GaugeMetricFamily("hvfleet_effective_capacity",
                                           "Effective capacity under the current spec", labels=labels),
            "allocation": GaugeMetricFamily("hvfleet_allocation", "Allocated (status.allocation)",
                                            labels=labels),
            "held": GaugeMetricFamily("hvfleet_reservations_held",
                                      "Space reservations still hold", labels=labels),
            "free": GaugeMetricFamily("hvfleet_free_capacity",
                                      "Effective − allocated − held (negative: overcommitted)",
                                      labels=labels),
        }
        state_family = GaugeMetricFamily("hvfleet_hypervisor_readiness",
                                         "1 for the host's readiness state", labels=["hypervisor", "state"])
        for row in self.state.sorted_rows():
            c = row.capacity
            for key, values in (("effective", c.effective), ("allocation", c.allocation),
                                ("held", row.held), ("free", c.free)):
                for r, q in values.items():
                    families[key].add_metric([row.name, str(r)], float(q.value))
            current = c.readiness.state if c.readiness else "Unknown"
            for s in READINESS_STATES:
                state_family.add_metric([row.name, s], 1.0 if s == current else 0.0)
        yield from families.values()
        yield state_family


def registry_for(state: FleetState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(state))
    registry.register(StoreCollector())
    return registry


async def metrics(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    who = await authenticate(ctx, request)
    ctx.authorize(who, Action("list", "hypervisors"))
    registry: CollectorRegistry = request.app.state.dashboard_metrics
    body = await run_in_threadpool(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
