"""Reading one `Observation` from a libvirt connection (the agent's I/O side).

Host facts (capabilities, domcapabilities, node info, versions) change only
when the host does, so they are read on connect and on every full resync;
domains are read on every pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from hvfleet.agent.reconcile import Observation
from hvfleet.discovery.host import NodeInfo
from hvfleet.discovery.libvirt_conn import LibvirtConnection


@dataclass(frozen=True)
class HostFacts:
    caps_xml: str
    domcaps_xml: str | None
    node_info: NodeInfo
    libvirt_version: str
    hypervisor_version: str


def read_host(conn: LibvirtConnection) -> HostFacts:
    return HostFacts(
        caps_xml=conn.capabilities(),
        domcaps_xml=conn.domain_capabilities(),
        node_info=conn.node_info(),
        libvirt_version=conn.libvirt_version(),
        hypervisor_version=conn.hypervisor_version(),
    )


def observe(
    conn: LibvirtConnection, host: HostFacts | None = None
) -> tuple[Observation, HostFacts]:
    """One pass over libvirt; `host` reuses host facts read earlier."""
    host = host or read_host(conn)
    domains = tuple(conn.domains())
    obs = Observation(
        uri=conn.uri,
        caps_xml=host.caps_xml,
        domcaps_xml=host.domcaps_xml,
        node_info=host.node_info,
        libvirt_version=host.libvirt_version,
        hypervisor_version=host.hypervisor_version,
        domains=domains,
        at=datetime.now(UTC),
    )
    return obs, host
