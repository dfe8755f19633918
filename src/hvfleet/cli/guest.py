"""`hvfleet cpu baseline` and `hvfleet guest generate|check|policies|explain`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from hvfleet.cli.main import app
from hvfleet.discovery.xmlsafe import read_xml_file
from hvfleet.guests.cpu import UnknownHostCPU
from hvfleet.guests.cpuxml import cpus_from_document, qemu_models_from_document
from hvfleet.guests.explain import explain as explain_plan
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.policy import LATEST, changelog_text
from hvfleet.guests.request import DiskSpec, HostGroup, NicSpec, parse_memory
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUModelInfo, HostCPU
from hvfleet.ops.guests import (
    CpuSource,
    GuestQuery,
    check,
    generate,
    group_of,
    plan,
    regenerate_guest,
    upgrade_guest,
)
from hvfleet.ops.guests import cpu_baseline as ops_cpu_baseline

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
        return group_of(store, selector, where="hosts")


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
    if files:
        cpus: list[tuple[str, HostCPU]] = []
        qemu_models: dict[str, list[CPUModelInfo]] = {}
        for path in files:
            root = read_xml_file(path)
            found = cpus_from_document(root, path)
            cpus += [(path if len(found) == 1 else f"{path}#{i + 1}", c)
                     for i, c in enumerate(found)]
            models = qemu_models_from_document(root)
            if models is not None:
                qemu_models[path] = models
        source = CpuSource(cpus, qemu_models)
    else:
        assert hosts is not None
        source = CpuSource.of_group(_store_group(hosts, store))
    try:
        answer = ops_cpu_baseline(source, expand, skip_unknown)
    except UnknownHostCPU as exc:
        if not exc.skippable:
            raise
        raise InvalidInput(f"{exc.reason}; --skip-unknown leaves them out") from None
    if answer.skipped:
        sys.stderr.write(
            f"warning: left out of the baseline, CPU unknown: {', '.join(answer.skipped)}\n"
        )
    if output == "xml":
        sys.stdout.write(answer.xml)
    else:
        sys.stdout.write(json.dumps(answer.document(), indent=2) + "\n")


def _query(os: str, name: str, vcpus: int, memory: str, disk: list[str] | None,
           nic: list[str] | None, firmware: str | None, secure_boot: bool, tpm: bool,
           mode: str | None, policy: str | None, drivers: list[str] | None = None) -> GuestQuery:
    """The options as the API's guest body (absent ones take its defaults)."""
    return GuestQuery.from_plain({
        "os": os, "name": name, "vcpus": vcpus, "memory": memory, "disks": disk, "nics": nic,
        "firmware": firmware, "secureBoot": secure_boot, "tpm": tpm, "mode": mode, "policy": policy,
        "drivers": drivers,
    })


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
        result = regenerate_guest(read_xml_file(from_), group, overrides, allow_abi_change)
        extra = result.report() + (explain_plan(result.plan) if explain else "")
        _write_xml(result.xml, output, extra)
        return
    missing = [f for f, v in (("--os", os), ("--name", name), ("--vcpus", vcpus),
                              ("--memory", memory)) if v is None]
    if missing:
        raise InvalidInput(f"give {', '.join(missing)} (or --from EXISTING.xml)")
    assert os is not None and name is not None and vcpus is not None and memory is not None
    answer = generate(_query(os, name, vcpus, memory, disk, nic, firmware, secure_boot, tpm, mode,
                             policy, drivers), group)
    for w in answer.warnings:
        sys.stderr.write(f"warning: {w}\n")
    _write_xml(answer.xml, output, answer.explanation() if explain else "")


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
    result = upgrade_guest(read_xml_file(domain), _group(hosts, caps_dir, store), policy, overrides)
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
    query = _query(os, name, vcpus, memory, disk, nic, firmware, secure_boot, tpm, mode, policy,
                   drivers)
    sys.stdout.write(explain_plan(plan(query, _group(hosts, caps_dir, store))))


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
    answer = check(read_xml_file(domain), _group(hosts, caps_dir, store))
    sys.stdout.write(answer.text())
    if not answer.ok:
        raise answer.not_everywhere()
