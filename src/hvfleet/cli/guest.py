"""`hvfleet cpu baseline` and `hvfleet guest generate|check|policies|explain`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from lxml import etree

from hvfleet.cli.main import app
from hvfleet.discovery.xmlsafe import read_xml_file
from hvfleet.guests.abi import regenerate, upgrade
from hvfleet.guests.check import check_domain
from hvfleet.guests.cpu import UnknownHostCPU, baseline_cpu, cpu_element, qemu_models_of
from hvfleet.guests.cpuxml import cpus_from_document, qemu_models_from_document
from hvfleet.guests.explain import explain as explain_plan
from hvfleet.guests.generate import generate as generate_guest
from hvfleet.guests.generate import plan_guest
from hvfleet.guests.hosts import group_from_store, load_caps_dir
from hvfleet.guests.policy import LATEST, changelog_text
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec, parse_memory
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUModelInfo, HostCPU

cpu_app = typer.Typer(help="CPU definitions for host groups.", no_args_is_help=True)
guest_app = typer.Typer(help="Guest definitions that run everywhere in a group.",
                        no_args_is_help=True)
app.add_typer(cpu_app, name="cpu")
app.add_typer(guest_app, name="guest")

HostsOpt = Annotated[str | None, typer.Option("--hosts", help="label selector over the store")]
CapsDirOpt = Annotated[
    str | None, typer.Option("--caps-dir", help="dir of <host>.caps.xml/<host>.domcaps.xml")
]
StoreOpt = Annotated[
    str | None, typer.Option("--store", help="store URL (default $HVFLEET_STORE)")
]


def _store_group(selector: str, store_url: str | None) -> HostGroup:
    from hvfleet.store import open_store

    with open_store(store_url) as store:
        hvs = store.list_hypervisors(selector)
    if not hvs:
        raise InvalidInput(f"--hosts {selector!r}: no hypervisor matches")
    return group_from_store([(h.metadata.name, h.status.host_capabilities) for h in hvs])


def _group(hosts: str | None, caps_dir: str | None, store_url: str | None) -> HostGroup:
    if (hosts is None) == (caps_dir is None):
        raise InvalidInput("give exactly one of --hosts SELECTOR or --caps-dir DIR")
    if caps_dir is not None:
        return load_caps_dir(caps_dir)
    assert hosts is not None
    return _store_group(hosts, store_url)


@cpu_app.command("baseline")
def cpu_baseline(
    files: Annotated[list[str] | None, typer.Argument(help="<cpu>, capabilities or "
                                                     "domcapabilities XML files")] = None,
    hosts: HostsOpt = None,
    store: StoreOpt = None,
    expand: Annotated[bool, typer.Option("--expand", help="list every feature")] = False,
    output: Annotated[str, typer.Option("-o", "--output", help="xml or json")] = "xml",
    skip_unknown: Annotated[bool, typer.Option(
        "--skip-unknown", help="leave out hosts whose CPU libvirt did not identify")] = False,
) -> None:
    """The CPU every given host can run: model + required/disabled features."""
    if output not in ("xml", "json"):
        raise InvalidInput(f"-o {output!r}: must be xml or json")
    if bool(files) == (hosts is not None):
        raise InvalidInput("give FILE... or --hosts SELECTOR (not both)")
    cpus: list[tuple[str, HostCPU]] = []
    qemu_models: dict[str, list[CPUModelInfo]] = {}
    if files:
        for path in files:
            root = read_xml_file(path)
            found = cpus_from_document(root, path)
            cpus += [(path if len(found) == 1 else f"{path}#{i + 1}", c)
                     for i, c in enumerate(found)]
            models = qemu_models_from_document(root)
            if models is not None:
                qemu_models[path] = models
    else:
        assert hosts is not None
        group = _store_group(hosts, store)
        cpus = [(n, c.cpu) for n, c in group.hosts]
        qemu_models = qemu_models_of(group.hosts)
    try:
        d = baseline_cpu(cpus, qemu_models=qemu_models, skip_unknown=skip_unknown)
    except UnknownHostCPU as exc:
        if not exc.skippable:
            raise
        raise InvalidInput(f"{exc.reason}; --skip-unknown leaves them out") from None
    if d.value.skipped:
        sys.stderr.write(
            f"warning: left out of the baseline, CPU unknown: {', '.join(d.value.skipped)}\n"
        )
    if output == "xml":
        sys.stdout.write(etree.tostring(cpu_element(d.value, expand), pretty_print=True,
                                        encoding="unicode"))
    else:
        c = d.value
        doc = {"model": c.model, "vendor": c.vendor, "require": list(c.require),
               "disable": list(c.disable), "hosts": len(cpus) - len(c.skipped)}
        if c.skipped:
            doc["skipped"] = list(c.skipped)
        if expand:
            doc["features"] = sorted(c.features)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def _request(os: str, name: str, vcpus: int, memory: str, disk: list[str] | None,
             nic: list[str] | None, firmware: str, secure_boot: bool, tpm: bool,
             mode: str, policy: str, drivers: list[str] | None = None) -> GuestRequest:
    return GuestRequest(
        os=os, name=name, vcpus=vcpus, memory=parse_memory(memory),
        disks=tuple(DiskSpec.parse(s) for s in disk or []),
        nics=tuple(NicSpec.parse(s) for s in nic or []),
        firmware=firmware, secure_boot=secure_boot, tpm=tpm, mode=mode, policy=policy,
        drivers=tuple(drivers or ()),
    )


OsOpt = Annotated[str, typer.Option("--os", help="osinfo short id, e.g. win11, rhel9.1")]
NameOpt = Annotated[str, typer.Option("--name")]
VcpuOpt = Annotated[int, typer.Option("--vcpus")]
MemOpt = Annotated[str, typer.Option("--memory", help="e.g. 4Gi")]
DiskOpt = Annotated[list[str] | None, typer.Option("--disk", help="kind=...,source=...")]
NicOpt = Annotated[list[str] | None, typer.Option("--nic", help="network=NAME | bridge=BR")]
FwOpt = Annotated[str, typer.Option("--firmware", help="auto, bios or efi")]
SbOpt = Annotated[bool, typer.Option("--secure-boot")]
TpmOpt = Annotated[bool, typer.Option("--tpm")]
ModeOpt = Annotated[str, typer.Option("--mode", help="intersection, host, software or none")]
PolicyOpt = Annotated[str, typer.Option("--policy")]
DriversOpt = Annotated[list[str] | None, typer.Option(
    "--drivers", help="extra drivers the guest's installer has (virtio-win)")]


OptOs = Annotated[str | None, typer.Option("--os", help="osinfo short id, e.g. win11, rhel9.1")]
OptName = Annotated[str | None, typer.Option("--name")]
OptVcpu = Annotated[int | None, typer.Option("--vcpus")]
OptMem = Annotated[str | None, typer.Option("--memory", help="e.g. 4Gi")]
OptFw = Annotated[str | None, typer.Option("--firmware", help="auto, bios or efi")]
OptMode = Annotated[str | None, typer.Option("--mode", help="intersection, host, software or none")]
OptPolicy = Annotated[str | None, typer.Option("--policy", help=f"default {LATEST}; with "
                                                "--from, the existing guest's")]
FromOpt = Annotated[str | None, typer.Option("--from", help="regenerate this existing domain "
                                             "XML, keeping its name, UUID and ABI")]
AllowOpt = Annotated[bool, typer.Option("--allow-abi-change", help="with --from: accept the ABI "
                                        "changes the group needs")]
OutOpt = Annotated[str | None, typer.Option("-o", "--output", help="write XML here")]


def _write_xml(xml: str, output: str | None, extra: str) -> None:
    """XML to `output` (extra text then to stdout) or to stdout (extra text to stderr)."""
    if output:
        try:
            with open(output, "w") as f:
                f.write(xml)
        except OSError as exc:
            raise InvalidInput(f"-o {output}: {exc.strerror}") from None
        sys.stdout.write(extra)
    else:
        sys.stdout.write(xml)
        sys.stderr.write(extra)


@guest_app.command("generate")
def guest_generate(
    os: OptOs = None, name: OptName = None, vcpus: OptVcpu = None, memory: OptMem = None,
    disk: DiskOpt = None, nic: NicOpt = None, firmware: OptFw = None,
    secure_boot: SbOpt = False, tpm: TpmOpt = False,
    hosts: HostsOpt = None, caps_dir: CapsDirOpt = None, store: StoreOpt = None,
    policy: OptPolicy = None, mode: OptMode = None, drivers: DriversOpt = None,
    from_: FromOpt = None, allow_abi_change: AllowOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="also print the decisions "
                                                          "(stderr when XML goes to stdout)")] = False,
    output: OutOpt = None,
) -> None:
    """Domain XML that starts and live-migrates on every host of the group."""
    group = _group(hosts, caps_dir, store)
    if from_ is not None:
        given: dict[str, object] = {
            "os": os, "vcpus": vcpus, "memory": parse_memory(memory) if memory else None,
            "disks": tuple(DiskSpec.parse(s) for s in disk) if disk else None,
            "nics": tuple(NicSpec.parse(s) for s in nic) if nic else None,
            "firmware": firmware, "secure_boot": secure_boot or None, "tpm": tpm or None,
            "mode": mode, "policy": policy, "drivers": tuple(drivers) if drivers else None,
        }
        if name is not None:
            raise InvalidInput("a regenerated guest keeps the existing name", field="name")
        overrides = {k: v for k, v in given.items() if v is not None}
        result = regenerate(read_xml_file(from_), group, overrides, allow_abi_change)
        extra = result.report() + (explain_plan(result.plan) if explain else "")
        _write_xml(result.xml, output, extra)
        return
    missing = [f for f, v in (("--os", os), ("--name", name), ("--vcpus", vcpus),
                              ("--memory", memory)) if v is None]
    if missing:
        raise InvalidInput(f"give {', '.join(missing)} (or --from EXISTING.xml)")
    assert os is not None and name is not None and vcpus is not None and memory is not None
    req = _request(os, name, vcpus, memory, disk, nic, firmware or "auto", secure_boot, tpm,
                   mode or "intersection", policy or LATEST, drivers)
    xml, plan = generate_guest(req, group)
    for w in plan.warnings:
        sys.stderr.write(f"warning: {w}\n")
    _write_xml(xml, output, explain_plan(plan) if explain else "")


@guest_app.command("upgrade")
def guest_upgrade(
    domain: Annotated[str, typer.Argument(help="existing domain XML file")],
    policy: Annotated[str, typer.Option("--policy", help="the policy version to move to")],
    hosts: HostsOpt = None, caps_dir: CapsDirOpt = None, store: StoreOpt = None,
    drivers: DriversOpt = None, output: OutOpt = None,
) -> None:
    """The guest under another policy version (same name and UUID), with the
    ABI-relevant settings that change."""
    overrides: dict[str, object] = {"drivers": tuple(drivers)} if drivers else {}
    result = upgrade(read_xml_file(domain), _group(hosts, caps_dir, store), policy, overrides)
    _write_xml(result.xml, output, result.report())


@guest_app.command("explain")
def guest_explain(
    os: OsOpt, policy: PolicyOpt = LATEST, name: NameOpt = "guest", vcpus: VcpuOpt = 2,
    memory: MemOpt = "4Gi", disk: DiskOpt = None, nic: NicOpt = None,
    firmware: FwOpt = "auto", secure_boot: SbOpt = False, tpm: TpmOpt = False,
    hosts: HostsOpt = None, caps_dir: CapsDirOpt = None, store: StoreOpt = None,
    mode: ModeOpt = "intersection", drivers: DriversOpt = None,
) -> None:
    """The decision table (value, reason, evidence), without XML."""
    req = _request(os, name, vcpus, memory, disk, nic, firmware, secure_boot, tpm, mode, policy,
                   drivers)
    sys.stdout.write(explain_plan(plan_guest(req, _group(hosts, caps_dir, store))))


@guest_app.command("policies")
def guest_policies() -> None:
    """Policy versions, each with what it changed relative to the one before."""
    sys.stdout.write(changelog_text())


@guest_app.command("check")
def guest_check(
    domain: Annotated[str, typer.Argument(help="domain XML file")],
    hosts: HostsOpt = None, caps_dir: CapsDirOpt = None, store: StoreOpt = None,
) -> None:
    """Per host: can the guest start and live-migrate there? Exit 3 if not everywhere."""
    verdicts = check_domain(read_xml_file(domain), _group(hosts, caps_dir, store))
    for v in verdicts:
        sys.stdout.write(f"{v.host}: {'ok' if v.ok else 'NO'}\n")
        for p in v.problems:
            sys.stdout.write(f"  - {p}\n")
        for w in v.warnings:
            sys.stdout.write(f"  ~ {w}\n")
    if not all(v.ok for v in verdicts):
        raise typer.Exit(3)
