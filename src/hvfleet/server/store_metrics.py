"""The store's own Prometheus counters on `GET /metrics`: how often a list or a
watch in this server skipped a stored object that does not decode
(hvfleet.store.undecodable). Non-zero means an object needs deleting or
replacing: the server's log names it."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from hvfleet.store.undecodable import skipped_counts


class StoreCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "hvfleet_store_undecodable_skipped",
            "Stored objects a list or watch skipped because they do not decode, by kind",
            labels=["kind"],
        )
        for kind, n in sorted(skipped_counts().items()):
            family.add_metric([kind], float(n))
        yield family
