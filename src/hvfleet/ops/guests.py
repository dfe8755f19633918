"""CPU baseline and guest generate / check / upgrade for a group of hosts.

The group is read from the store by one label selector lookup (`group_of`) or
given by the CLI from saved XML; the request forms are the API's bodies, the
CLI's options and the dashboard's forms mapped to the same dict; each answer
has one document (`document()`) that every edge shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lxml import etree
from pydantic import Field

from hvfleet.guests import datacache
from hvfleet.guests.abi import Regeneration, regenerate, upgrade
from hvfleet.guests.check import HostVerdict, NotEverywhere, check_domain
from hvfleet.guests.cpu import baseline_cpu, cpu_element, qemu_models_of
from hvfleet.guests.cpuxml import cpus_from_texts
from hvfleet.guests.explain import explain as explain_plan
from hvfleet.guests.generate import generate as generate_guest
from hvfleet.guests.generate import plan_guest
from hvfleet.guests.hosts import group_from_store
from hvfleet.guests.plan import Plan
from hvfleet.guests.policy import LATEST
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec, parse_memory
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUModelInfo, HostCPU
from hvfleet.model.selectors import parse_selector
from hvfleet.ops.parsing import Query

if TYPE_CHECKING:
    from hvfleet.store.base import Store


def fresh_data(every: float = 1.0) -> None:
    """osinfo-db and cpu_map are kept in memory by a long-running process;
    before a CPU or guest operation they are checked for a change (at most once
    per `every` seconds), so an upgraded package is read without a restart."""
    datacache.revalidate(every=every)


def group_of(store: Store, selector: str, where: str = "labelSelector") -> HostGroup:
    """The hosts `selector` matches, as a group; `where` is the edge's name for
    the selector (`--hosts`, `labelSelector`) in the error when none matches."""
    hvs = store.list_hypervisors(parse_selector(selector))
    if not hvs:
        raise InvalidInput(f"{selector!r}: no hypervisor matches", field=where)
    return group_from_store([(h.metadata.name, h.status.host_capabilities) for h in hvs])


# -- CPU baseline ------------------------------------------------------------------------------

class CpuBaselineQuery(Query):
    """Either the hosts in the store matching a selector, or CPU/capabilities XML texts."""

    label_selector: str | None = None
    cpus: list[str] = Field(default_factory=list)
    expand: bool = False
    # Leave out hosts whose CPU libvirt did not identify (else they are refused).
    skip_unknown: bool = False

@dataclass(frozen=True)
class CpuSource:
    """The CPUs to baseline, each named, and what QEMU can run per host when known."""

    cpus: Sequence[tuple[str, HostCPU]]
    qemu_models: Mapping[str, list[CPUModelInfo]] | None = None

    @classmethod
    def of_group(cls, group: HostGroup) -> CpuSource:
        return cls([(n, c.cpu) for n, c in group.hosts], qemu_models_of(group.hosts))

    @classmethod
    def of_texts(cls, texts: Sequence[str]) -> CpuSource:
        return cls(cpus_from_texts([(f"cpus[{i}]", text) for i, text in enumerate(texts)]))


@dataclass(frozen=True)
class CpuBaselineAnswer:
    model: str
    vendor: str | None
    require: list[str]
    disable: list[str]
    hosts: int
    skipped: list[str]
    features: list[str] | None
    xml: str

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"model": self.model, "vendor": self.vendor, "require": self.require,
                               "disable": self.disable, "hosts": self.hosts, "xml": self.xml}
        if self.skipped:
            doc["skipped"] = self.skipped
        if self.features is not None:
            doc["features"] = self.features
        return doc


def cpu_baseline(source: CpuSource, expand: bool = False, skip_unknown: bool = False) -> CpuBaselineAnswer:
    """The CPU every host of `source` can run. UnknownHostCPU (an InvalidInput)
    names the hosts libvirt did not identify unless `skip_unknown`."""
    fresh_data()
    c = baseline_cpu(list(source.cpus), qemu_models=dict(source.qemu_models or {}),
                     skip_unknown=skip_unknown).value
    return CpuBaselineAnswer(
        model=c.model, vendor=c.vendor, require=list(c.require), disable=list(c.disable),
        hosts=len(source.cpus) - len(c.skipped), skipped=list(c.skipped),
        features=sorted(c.features) if expand else None,
        xml=etree.tostring(cpu_element(c, expand), pretty_print=True, encoding="unicode"),
    )


# -- generate ----------------------------------------------------------------------------------

class GuestQuery(Query):
    os: str
    name: str
    vcpus: int
    memory: str
    disks: list[str] = Field(default_factory=list)
    nics: list[str] = Field(default_factory=list)
    firmware: str = "auto"
    secure_boot: bool = False
    tpm: bool = False
    mode: str = "intersection"
    policy: str = LATEST
    drivers: list[str] = Field(default_factory=list)
    label_selector: str = ""
    explain: bool = False

    def request(self) -> GuestRequest:
        return GuestRequest(
            os=self.os, name=self.name, vcpus=self.vcpus, memory=parse_memory(self.memory),
            disks=tuple(DiskSpec.parse(s) for s in self.disks),
            nics=tuple(NicSpec.parse(s) for s in self.nics),
            firmware=self.firmware, secure_boot=self.secure_boot, tpm=self.tpm, mode=self.mode,
            policy=self.policy, drivers=tuple(self.drivers),
        )


@dataclass(frozen=True)
class GuestAnswer:
    xml: str
    plan: Plan
    explain: bool = False

    @property
    def warnings(self) -> list[str]:
        return list(self.plan.warnings)

    def explanation(self) -> str:
        return explain_plan(self.plan)

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"xml": self.xml, "warnings": self.warnings}
        if self.explain:
            doc["explain"] = self.explanation()
        return doc


def generate(query: GuestQuery, group: HostGroup) -> GuestAnswer:
    """Domain XML that starts and live-migrates on every host of `group`."""
    fresh_data()
    xml, plan = generate_guest(query.request(), group)
    return GuestAnswer(xml, plan, query.explain)


def plan(query: GuestQuery, group: HostGroup) -> Plan:
    """The decisions alone (`guest explain`)."""
    fresh_data()
    return plan_guest(query.request(), group)


def regenerate_guest(domain: etree._Element, group: HostGroup, overrides: Mapping[str, object],
                     allow_abi_change: bool) -> Regeneration:
    """An existing guest generated again for `group`, keeping its name, UUID and ABI."""
    fresh_data()
    return regenerate(domain, group, dict(overrides), allow_abi_change)


def upgrade_guest(domain: etree._Element, group: HostGroup, policy: str,
                  overrides: Mapping[str, object]) -> Regeneration:
    """The guest under another policy version, with the ABI changes it makes."""
    fresh_data()
    return upgrade(domain, group, policy, dict(overrides))


# -- check -------------------------------------------------------------------------------------

class GuestCheckQuery(Query):
    domain: str
    label_selector: str = ""


@dataclass(frozen=True)
class GuestCheckAnswer:
    verdicts: list[HostVerdict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def document(self) -> dict[str, Any]:
        return {"ok": self.ok,
                "hosts": [{"host": v.host, "ok": v.ok, "problems": list(v.problems),
                           "warnings": list(v.warnings)} for v in self.verdicts]}

    def text(self) -> str:
        """Per host `name: ok|NO`, its problems (`-`) and warnings (`~`)."""
        out = []
        for v in self.verdicts:
            out.append(f"{v.host}: {'ok' if v.ok else 'NO'}\n")
            out += [f"  - {p}\n" for p in v.problems]
            out += [f"  ~ {w}\n" for w in v.warnings]
        return "".join(out)

    def not_everywhere(self) -> NotEverywhere:
        bad = [v.host for v in self.verdicts if not v.ok]
        return NotEverywhere(f"the guest does not run on {len(bad)} of {len(self.verdicts)} hosts: "
                             + ", ".join(bad))


def check(domain: etree._Element, group: HostGroup) -> GuestCheckAnswer:
    """Per host of `group`: can the guest start and live-migrate there? A
    definition libvirt itself refuses (its schema and domain parser:
    `domain_xml_error`) can start nowhere: that is a problem on every host."""
    from hvfleet.discovery.libvirt_conn import domain_xml_error  # libvirt for `check` alone

    fresh_data()
    verdicts = list(check_domain(domain, group))
    refused = domain_xml_error(domain)
    if refused is not None:
        for v in verdicts:
            v.problems.insert(0, f"libvirt refuses the definition: {refused}")
    return GuestCheckAnswer(verdicts)
