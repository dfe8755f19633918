"""The guest CPU: one definition every host of a group can run and migrate to.

Each host CPU is expanded to its full feature set with libvirt's cpu_map
(model features + required − disabled). The group's CPU is their
intersection; the named model closest to it (fewest features to add plus
remove, so it covers most of the intersection with little outside it)
becomes `<model>`, the rest `require`, and the model's features missing from
the intersection `disable`. Features libvirt marks non-migratable (invtsc,
xsaves) are left out of the intersection first. `check='full'` makes QEMU refuse to start a
guest whose CPU would differ from what is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lxml import etree

from hvfleet.guests.cpumap import CPUMap, CPUModel, load_cpu_map
from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import HostCapabilities, HostCPU

MODES = ("intersection", "host", "software", "none")


@dataclass(frozen=True)
class GuestCPU:
    mode: str
    model: str
    vendor: str  # "" when the group mixes vendors (software/none modes)
    require: tuple[str, ...]
    disable: tuple[str, ...]
    features: frozenset[str]  # every feature the guest sees


def expand_cpu(cpu: HostCPU, cmap: CPUMap, where: str) -> frozenset[str]:
    """The full feature set of a CPU definition, in libvirt's feature names."""
    base: frozenset[str] = frozenset()
    if cpu.model:
        base = cmap.model(cpu.model, where).features
    added = {cmap.canonical_feature(f) for f in cpu.features}
    removed = {cmap.canonical_feature(f) for f in cpu.disabled_features}
    return frozenset((base | added) - removed)


def _group_vendor(hosts: Sequence[tuple[str, HostCPU]]) -> tuple[str, dict[str, list[str]]]:
    by_vendor: dict[str, list[str]] = {}
    for name, cpu in hosts:
        by_vendor.setdefault(cpu.vendor or "unknown", []).append(name)
    vendor = next(iter(by_vendor)) if len(by_vendor) == 1 else ""
    return vendor, by_vendor


def _best_model(cmap: CPUMap, features: frozenset[str], vendor: str) -> CPUModel:
    fits = [m for m in cmap.models.values() if not m.vendor or m.vendor == vendor]
    # Distance = features to require + features to disable; ties go to the
    # richer, vendor-specific, newer model.
    return min(
        fits,
        key=lambda m: (
            len(features - m.features) + len(m.features - features),
            -len(m.features),
            not m.vendor,
            -m.position,
        ),
    )


def baseline_cpu(
    hosts: Sequence[tuple[str, HostCPU]], cmap: CPUMap | None = None
) -> Decision[GuestCPU]:
    """The intersection CPU of `hosts` (name, host CPU); InvalidInput on mixed vendors."""
    if not hosts:
        raise InvalidInput("cpu baseline: no host CPUs given")
    cmap = cmap or load_cpu_map()
    vendor, by_vendor = _group_vendor(hosts)
    if not vendor:
        split = "; ".join(f"{v}: {hosts_list(n, 3)}" for v, n in sorted(by_vendor.items()))
        raise InvalidInput(
            f"cpu baseline: hosts have different CPU vendors ({split}); "
            "use --mode software or --mode none"
        )
    # Hosts of the same hardware share one CPU definition: expand each
    # distinct definition once (a 1000-host fleet has a few dozen).
    expanded: dict[tuple[str, tuple[str, ...], tuple[str, ...]], frozenset[str]] = {}
    for name, cpu in hosts:
        key = (cpu.model, tuple(cpu.features), tuple(cpu.disabled_features))
        if key not in expanded:
            expanded[key] = expand_cpu(cpu, cmap, name)
    sets = list(expanded.values())
    common = frozenset.intersection(*sets)
    known = frozenset(cmap.features)
    unknown = sorted(common - known)
    common &= known
    # Features libvirt marks non-migratable (invtsc, xsaves) would pin the
    # guest to its host: they are left out, and disabled where the model has them.
    dropped = sorted(common & cmap.non_migratable)
    common -= cmap.non_migratable
    model = _best_model(cmap, common, vendor)
    require = tuple(sorted(common - model.features))
    # QEMU's own model may carry features libvirt's cpu_map does not list (its
    # EPYC has topoext); a host-model CPU says so by disabling them. Disable
    # every such feature too, so check='full' compares like with like.
    host_disabled = {cmap.canonical_feature(f) for key in expanded for f in key[2]}
    disable = tuple(sorted((model.features | (host_disabled & known)) - common))
    features = frozenset((model.features | set(require)) - set(disable))
    assert features <= common
    evidence = [
        f"{len(hosts)} host(s), vendor {vendor}: {hosts_list([n for n, _ in hosts])}",
        f"{len(common)} migratable features common to all hosts "
        f"({len(sets)} distinct host CPU definitions, smallest has {min(len(s) for s in sets)})",
        f"model {model.name}: {len(model.features)} features, "
        f"{len(model.features & common)} of them common",
    ]
    if dropped:
        evidence.append(f"non-migratable, left out: {', '.join(dropped)}")
    if unknown:
        evidence.append(f"unknown to this libvirt's cpu_map, left out: {', '.join(unknown)}")
    return Decision(
        "cpu",
        GuestCPU("intersection", model.name, vendor, require, disable, features),
        f"{model.name} +{len(require)} -{len(disable)} features",
        "the named model closest to the features every host shares; the rest "
        "required, the model's features some host lacks disabled",
        tuple(evidence),
    )


def _usable_everywhere(
    hosts: Sequence[tuple[str, HostCapabilities]], cmap: CPUMap
) -> tuple[list[CPUModel], list[str]]:
    """Models every host can run: per domcapabilities where given, else by features."""
    ok = list(cmap.models.values())
    evidence: list[str] = []
    for name, caps in hosts:
        if caps.cpu_models is not None:
            usable = {m.name for m in caps.cpu_models if m.usable}
            evidence.append(f"{name}: {len(usable)} usable models (domcapabilities)")
        else:
            have = expand_cpu(caps.cpu, cmap, name)
            usable = {m.name for m in cmap.models.values() if m.features <= have}
            evidence.append(f"{name}: {len(usable)} models fit its CPU (no domcapabilities)")
        ok = [m for m in ok if m.name in usable]
    return ok, evidence


def software_cpu(
    hosts: Sequence[tuple[str, HostCapabilities]], conservative: bool,
    cmap: CPUMap | None = None,
) -> Decision[GuestCPU]:
    """A named model with no host-specific extras (software), or the most
    conservative 64-bit model every host runs (none)."""
    cmap = cmap or load_cpu_map()
    vendor, _ = _group_vendor([(n, c.cpu) for n, c in hosts])
    models, evidence = _usable_everywhere(hosts, cmap)
    models = [m for m in models if "lm" in m.features and (not m.vendor or m.vendor == vendor)]
    if not models:
        raise InvalidInput("cpu: no 64-bit CPU model is usable on every host of the group")
    mode = "none" if conservative else "software"
    if conservative:
        preferred = [m for m in models if m.name == "qemu64"]
        model = preferred[0] if preferred else min(models, key=lambda m: (len(m.features), m.name))
        reason = "the most conservative 64-bit model every host runs (no host-specific features)"
    else:
        model = max(models, key=lambda m: (len(m.features), bool(m.vendor), m.position))
        reason = (
            "the richest named model every host marks usable, with no extra features"
            + ("" if vendor else " (vendor-neutral models only: the hosts' vendors differ)")
        )
    return Decision(
        "cpu",
        GuestCPU(mode, model.name, vendor if model.vendor else "", (), (), model.features),
        model.name,
        reason,
        (f"{len(models)} models usable on all {len(hosts)} hosts", *evidence[:6]),
    )


def host_cpu(
    hosts: Sequence[tuple[str, HostCapabilities]], cmap: CPUMap | None = None
) -> Decision[GuestCPU]:
    """host mode: the single host's host-model CPU, written out explicitly."""
    if len(hosts) != 1:
        raise InvalidInput(f"cpu: --mode host needs exactly one host, got {len(hosts)}")
    name, caps = hosts[0]
    cmap = cmap or load_cpu_map()
    d = baseline_cpu([(name, caps.cpu)], cmap)
    return Decision(
        "cpu",
        GuestCPU("host", *(getattr(d.value, f) for f in ("model", "vendor", "require",
                                                           "disable", "features"))),
        d.shown,
        f"host-model CPU of {name} ({caps.cpu.source or 'unknown source'}), written out",
        d.evidence,
    )


def decide_cpu(
    mode: str, hosts: Sequence[tuple[str, HostCapabilities]], cmap: CPUMap | None = None
) -> Decision[GuestCPU]:
    if mode == "intersection":
        return baseline_cpu([(n, c.cpu) for n, c in hosts], cmap)
    if mode == "host":
        return host_cpu(hosts, cmap)
    if mode in ("software", "none"):
        return software_cpu(hosts, conservative=mode == "none", cmap=cmap)
    raise InvalidInput(f"--mode: {mode!r} is not one of {', '.join(MODES)}")


def cpu_element(cpu: GuestCPU, expand: bool = False) -> etree._Element:
    """`<cpu mode='custom' match='exact' check='full'>` for `cpu`."""
    el = etree.Element("cpu", mode="custom", match="exact", check="full")
    etree.SubElement(el, "model", fallback="forbid").text = cpu.model
    if cpu.vendor:
        etree.SubElement(el, "vendor").text = cpu.vendor
    if expand:
        for f in sorted(cpu.features):
            etree.SubElement(el, "feature", policy="require", name=f)
    else:
        for f in cpu.require:
            etree.SubElement(el, "feature", policy="require", name=f)
    for f in cpu.disable:
        etree.SubElement(el, "feature", policy="disable", name=f)
    return el


def cpus_from_texts(docs: Sequence[tuple[str, str]]) -> list[tuple[str, HostCPU]]:
    """(name, HostCPU) for (name, XML text) pairs; identical texts are parsed once."""
    from hvfleet.discovery.xmlsafe import parse_xml

    parsed: dict[str, list[HostCPU]] = {}
    out: list[tuple[str, HostCPU]] = []
    for name, text in docs:
        if text not in parsed:
            parsed[text] = cpus_from_document(parse_xml(text, name), name)
        found = parsed[text]
        if len(found) == 1:
            out.append((name, found[0]))
        else:
            out += [(f"{name}#{i + 1}", c) for i, c in enumerate(found)]
    return out


def cpus_from_document(root: etree._Element, where: str) -> list[HostCPU]:
    """Host CPUs in a `virsh cpu-baseline`-style file, a `<capabilities>` or a
    `<domainCapabilities>` document (its host-model CPU)."""
    from hvfleet.discovery.capabilities import parse_cpu_element

    if root.tag == "cpu":
        return [parse_cpu_element(root, where)]
    if root.tag == "capabilities":
        cpu = root.find("host/cpu")
        if cpu is None:
            raise InvalidInput(f"{where}: <capabilities> without <host><cpu>")
        return [parse_cpu_element(cpu, where)]
    if root.tag == "domainCapabilities":
        for mode in root.findall("cpu/mode"):
            if mode.get("name") == "host-model" and mode.get("supported") == "yes":
                return [parse_cpu_element(mode, where)]
        raise InvalidInput(f"{where}: <domainCapabilities> has no supported host-model CPU")
    found = list(root.iter("cpu"))
    if not found:
        raise InvalidInput(f"{where}: no <cpu> element")
    return [parse_cpu_element(c, f"{where} cpu #{i + 1}") for i, c in enumerate(found)]


def floor_cpu(
    hosts: Sequence[tuple[str, HostCapabilities]], model_name: str, require: tuple[str, ...],
    policy_version: str, cmap: CPUMap | None = None,
) -> Decision[GuestCPU]:
    """mode none (policies with mode_scope "all"): the policy's fixed model,
    chosen without looking at the hosts, then checked to be usable on each
    host whose domcapabilities say."""
    cmap = cmap or load_cpu_map()
    model = cmap.model(model_name, f"policy {policy_version}")
    lacking = [n for n, c in hosts if c.cpu_models is not None
               and not any(m.name == model_name and m.usable is not False for m in c.cpu_models)]
    if lacking:
        raise InvalidInput(
            f"cpu: mode none uses policy {policy_version}'s model {model_name}, which is not "
            f"usable on {hosts_list(lacking)}"
        )
    return Decision(
        "cpu",
        GuestCPU("none", model.name, "", require, (), model.features | set(require)),
        model.name + "".join(f" +{f}" for f in require),
        f"mode none: policy {policy_version}'s fixed model, no host-specific features",
        (f"{model_name} usable on every host that lists its models",),
    )
