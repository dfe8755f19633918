"""The guest CPU: one definition every host of a group can run and migrate to.

Each host CPU is expanded to its full feature set with libvirt's cpu_map
(model features + required − disabled; features cpu_map marks removed from a
model are not the model's). The group's CPU is their intersection; the named
model closest to it (fewest features to add plus remove, so it covers most of
the intersection with little outside it) becomes `<model>`, the rest
`require`, and the model's features missing from the intersection `disable`,
with the features cpu_map marks removed from it. Features libvirt marks
non-migratable (invtsc, xsaves) are left out of the intersection first.
`check='full'` makes QEMU refuse to start a guest whose CPU would differ from
what is written. The model is chosen only among those every host's QEMU knows
(its domcapabilities custom-mode list, where libvirt gave one) and can run
with the guest's features: a model unusable on a host only when its blockers
are all disabled. Failing the closest, the next closest: an older model plus
features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, itemgetter

from lxml import etree

from hvfleet.guests.cpumap import CPUMap, CPUModel, load_cpu_map
from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.errors import NotEverywhere
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUModelInfo, HostCapabilities, HostCPU

MODES = ("intersection", "host", "software", "none")


@dataclass(frozen=True)
class GuestCPU:
    mode: str
    model: str
    vendor: str  # "" when the group mixes vendors (software/none modes)
    require: tuple[str, ...]
    disable: tuple[str, ...]
    features: frozenset[str]  # every feature the guest sees
    # Hosts left out because their CPU is unknown (baseline with skip_unknown).
    skipped: tuple[str, ...] = ()


class UnknownHostCPU(InvalidInput):
    """Hosts whose CPU libvirt did not identify (no model, as on its test
    driver): any CPU computed over them would fit no real host (model 486
    with fpu, pse and vme disabled), so it is refused."""

    def __init__(self, hosts: Sequence[str], skippable: bool) -> None:
        self.hosts = tuple(hosts)
        self.skippable = skippable
        # The message without the hint, for an edge that names its own option.
        self.reason = (
            f"hosts: the CPU of {hosts_list(list(hosts))} is unknown (libvirt reported no "
            "CPU model, as its test driver does)"
        )
        how = (
            "leave them out (skip_unknown) or choose hosts whose CPU is known"
            if skippable
            else "a guest must run on every host of its group: choose hosts whose CPU is known"
        )
        super().__init__(f"{self.reason}; {how}")


def is_unknown_cpu(cpu: HostCPU) -> bool:
    """True when libvirt gave no CPU model: nothing can be said of its features."""
    return not cpu.model


def expand_cpu(cpu: HostCPU, cmap: CPUMap, where: str) -> frozenset[str]:
    """The full feature set of a CPU definition, in libvirt's feature names."""
    base: frozenset[str] = frozenset()
    if cpu.model:
        base = cmap.model(cpu.model, where).features
    canonical = cmap.aliases.get
    out = base.union([canonical(f, f) for f in cpu.features])
    if cpu.disabled_features:
        out = out.difference([canonical(f, f) for f in cpu.disabled_features])
    return out


def _group_vendor(hosts: Sequence[tuple[str, HostCPU]]) -> tuple[str, dict[str, list[str]]]:
    vendors = set(map(_VENDOR_OF, map(_CPU_OF, hosts)))
    if len(vendors) == 1:  # the usual case, without a Python step per host
        vendor = vendors.pop() or "unknown"
        return vendor, {vendor: list(map(_NAME_OF, hosts))}
    by_vendor: dict[str, list[str]] = {}
    for name, cpu in hosts:
        by_vendor.setdefault(cpu.vendor or "unknown", []).append(name)
    vendor = next(iter(by_vendor)) if len(by_vendor) == 1 else ""
    return vendor, by_vendor


# A distinct host CPU definition: model, features, disabled features, and
# the features its QEMU blocks.
_CPUDef = tuple[str, tuple[str, ...], tuple[str, ...], frozenset[str]]
_NAME_OF = itemgetter(0)
_CPU_OF = itemgetter(1)
_MODEL_OF = attrgetter("model")
_VENDOR_OF = attrgetter("vendor")
_FEATURES_OF = attrgetter("features")
_DISABLED_OF = attrgetter("disabled_features")

QEMUModels = Mapping[str, Sequence[CPUModelInfo]]
"""Per host name, the CPU models its QEMU offers (domcapabilities custom mode);
hosts libvirt said nothing about are absent."""


def qemu_models_of(hosts: Sequence[tuple[str, HostCapabilities]]) -> dict[str, list[CPUModelInfo]]:
    return {n: c.cpu_models for n, c in hosts if c.cpu_models is not None}


def _blocked(cmap: CPUMap, models: Sequence[CPUModelInfo]) -> frozenset[str]:
    """Features the host's QEMU says it cannot give (blockers of unusable models)."""
    return frozenset(
        cmap.canonical_feature(f) for m in models if m.usable is False for f in m.blockers or ()
    )


def _qemu_refuses(
    model: CPUModel, common: frozenset[str], qemu_models: QEMUModels, cmap: CPUMap
) -> list[str]:
    """Why some host's QEMU cannot run `model` as the guest would ask for it
    (every feature outside `common` disabled); empty when all can."""
    why: list[str] = []
    for host, models in qemu_models.items():
        info = next((m for m in models if m.name == model.name), None)
        if info is None:
            why.append(f"{host}: unknown to its QEMU")
        elif info.usable is False and info.blockers is not None:
            needed = sorted({cmap.canonical_feature(f) for f in info.blockers} & common)
            if needed:
                why.append(f"{host}: unusable without {', '.join(needed)}")
        # usable='no' without blockers (libvirt before 10.x does not list
        # them): what blocks it is what the host CPU lacks of the model, and
        # the guest disables all of that. Real QEMU agrees: a TCG host marks
        # EPYC unusable, and EPYC with those features disabled starts there.
    return why


def _best_model(
    cmap: CPUMap, features: frozenset[str], vendor: str, qemu_models: QEMUModels
) -> tuple[CPUModel, list[str]]:
    """The closest model every host's QEMU knows and can run, and evidence for
    any closer one left out."""
    fits = [m for m in cmap.models.values() if not m.vendor or m.vendor == vendor]
    # Distance = features to require + features to disable; ties go to the
    # richer, vendor-specific, newer model.
    fits.sort(
        key=lambda m: (
            len(features - m.features) + len(m.features - features),
            -len(m.features),
            not m.vendor,
            -m.position,
        ),
    )
    left_out: list[str] = []
    for m in fits:
        why = _qemu_refuses(m, features, qemu_models, cmap)
        if not why:
            return m, left_out
        if len(left_out) < 3:
            left_out.append(f"closer model {m.name} left out: {hosts_list(why, 3)}")
    hosts = hosts_list(sorted(qemu_models))
    raise NotEverywhere(
        f"cpu: no CPU model of libvirt's cpu_map is known and usable on the QEMU of "
        f"every host ({hosts})"
    )


def baseline_cpu(
    hosts: Sequence[tuple[str, HostCPU]],
    cmap: CPUMap | None = None,
    qemu_models: QEMUModels | None = None,
    skip_unknown: bool = False,
    skippable: bool = True,
) -> Decision[GuestCPU]:
    """The intersection CPU of `hosts` (name, host CPU); InvalidInput on mixed vendors.

    With `qemu_models` (what each host's QEMU offers, from domcapabilities),
    the model is one every such host knows and can run with the guest's
    features, and the features a host's QEMU lists as blockers are taken as
    missing on that host.

    Hosts whose CPU is unknown (`is_unknown_cpu`) raise UnknownHostCPU, or are
    left out when `skip_unknown` (listed in the result's `skipped`);
    `skippable` False says the caller cannot leave hosts out (a guest)."""
    if not hosts:
        raise InvalidInput("cpu baseline: no host CPUs given")
    # (is_unknown_cpu, without a call per host: that is a tenth of a
    # 1000-host baseline.)
    unknown_hosts = ([] if all(map(_MODEL_OF, map(_CPU_OF, hosts)))
                     else [n for n, c in hosts if is_unknown_cpu(c)])
    if unknown_hosts and not (skip_unknown and skippable):
        raise UnknownHostCPU(unknown_hosts, skippable)
    if unknown_hosts:
        hosts = [(n, c) for n, c in hosts if not is_unknown_cpu(c)]
        if not hosts:
            raise UnknownHostCPU(unknown_hosts, skippable=False)
    cmap = cmap or load_cpu_map()
    vendor, by_vendor = _group_vendor(hosts)
    if not vendor:
        split = "; ".join(f"{v}: {hosts_list(n, 3)}" for v, n in sorted(by_vendor.items()))
        raise InvalidInput(
            f"cpu baseline: hosts have different CPU vendors ({split}); "
            "use mode software or none"
        )
    qemu_models = qemu_models or {}
    # What each host's QEMU blocks is part of its definition.
    blocked_of = {n: b for n, ms in qemu_models.items() if (b := _blocked(cmap, ms))}
    # Hosts of the same hardware share one CPU definition (and, from
    # cpus_from_texts, one object): each distinct definition is expanded
    # once. Found with maps over the hosts, in C: a Python step per host is
    # most of the time of a 1000-host baseline.
    cpus = ([c for n, c in hosts if n not in blocked_of] if blocked_of
            else list(map(_CPU_OF, hosts)))
    cpus = list(dict(zip(map(id, cpus), cpus, strict=True)).values())  # each object once
    nothing: frozenset[str] = frozenset()
    defs: dict[_CPUDef, None] = dict.fromkeys(zip(
        map(_MODEL_OF, cpus), map(tuple, map(_FEATURES_OF, cpus)),
        map(tuple, map(_DISABLED_OF, cpus)), repeat(nothing),
    ))
    for n, c in hosts if blocked_of else ():
        if n in blocked_of:
            defs[(c.model, tuple(c.features), tuple(c.disabled_features), blocked_of[n])] = None
    models = cmap.models
    if not models.keys() >= {d[0] for d in defs}:
        cmap.model(*next((c.model, n) for n, c in hosts if c.model not in models))  # raises
    # Per model M, the hosts' sets (M | added_h) - removed_h intersect to
    # (M | (every extra_h in common)) - (any removed_h), where extra_h =
    # added_h - M: only the hosts' own short lists are intersected, not each
    # host's full feature set. Most definitions remove nothing (`virsh
    # capabilities` lists only what a host has): theirs are taken together.
    by_model: dict[str, tuple[list[tuple[str, ...]], list[_CPUDef]]] = {}  # → (features, others)
    for d in defs:
        group = by_model.get(d[0])
        if group is None:
            group = by_model[d[0]] = ([], [])
        if d[2] or d[3]:
            group[1].append(d)
        else:
            group[0].append(d[1])
    aliases = cmap.aliases
    canonical = aliases.get
    no_alias_in = aliases.keys().isdisjoint
    disabled_seen: set[str] = set()
    per_model: list[frozenset[str]] = []  # each model's part of the intersection
    sizes: list[int] = []  # of each model's smallest expanded definition
    for model_name, (plain, others) in by_model.items():
        base = models[model_name].features
        # The features outside the model, canonicalised only when one is
        # spelled by an alias (never a name in the model: cpumap keeps them
        # apart). Set operations in C, per definition.
        extras: list[set[str]] = list(map(set.difference, map(set, plain), repeat(base)))
        if not all(map(no_alias_in, extras)):
            extras = [e if no_alias_in(e) else {canonical(f, f) for f in e} - base for e in extras]
        if extras:
            sizes.append(len(base) + min(map(len, extras)))
        removed_any: set[str] = set()
        for _, feats, dis, blocked in others:
            disabled_seen.update(dis)
            extra = set(feats) - base
            if not no_alias_in(extra):
                extra = {canonical(f, f) for f in extra} - base
            removed = (set(dis) if no_alias_in(dis) else {canonical(f, f) for f in dis}) | blocked
            sizes.append(len(base) + len(extra) - len(removed & base) - len(removed & extra))
            extras.append(extra)
            removed_any |= removed
        per_model.append((base | set.intersection(*extras)) - removed_any)
    smallest = min(sizes)
    common = frozenset.intersection(*per_model)
    known = frozenset(cmap.features)
    unknown = sorted(common - known)
    common &= known
    # Features libvirt marks non-migratable (invtsc, xsaves) would pin the
    # guest to its host: they are left out, and disabled where the model has them.
    dropped = sorted(common & cmap.non_migratable)
    common -= cmap.non_migratable
    model, left_out = _best_model(cmap, common, vendor, qemu_models)
    require = tuple(sorted(common - model.features))
    # QEMU's own model may carry features libvirt's cpu_map does not list (its
    # EPYC has topoext); a host-model CPU says so by disabling them. Disable
    # every such feature too, so check='full' compares like with like.
    host_disabled = {cmap.canonical_feature(f) for f in disabled_seen}
    # Features cpu_map marks removed from the model are disabled explicitly,
    # as libvirt's baseline does: the model name alone once carried them.
    disable = tuple(sorted((model.features | model.removed | (host_disabled & known)) - common))
    features = frozenset((model.features | set(require)) - set(disable))
    assert features <= common
    evidence = [
        f"{len(hosts)} host(s), vendor {vendor}: {hosts_list([n for n, _ in hosts])}",
        f"{len(common)} migratable features common to all hosts "
        f"({len(defs)} distinct host CPU definitions, smallest has {smallest})",
        f"model {model.name}: {len(model.features)} features, "
        f"{len(model.features & common)} of them common",
    ]
    if qemu_models:
        evidence.append(
            f"model known and usable on the QEMU of {len(qemu_models)} host(s) "
            "(domcapabilities)"
        )
    evidence += left_out
    if unknown_hosts:
        evidence.append(f"left out, CPU unknown: {hosts_list(unknown_hosts)}")
    if dropped:
        evidence.append(f"non-migratable, left out: {', '.join(dropped)}")
    if unknown:
        evidence.append(f"unknown to this libvirt's cpu_map, left out: {', '.join(unknown)}")
    return Decision(
        "cpu",
        GuestCPU("intersection", model.name, vendor, require, disable, features,
                 tuple(unknown_hosts)),
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
    blind = [n for n, c in hosts if c.cpu_models is None and is_unknown_cpu(c.cpu)]
    if blind:
        raise UnknownHostCPU(blind, skippable=False)
    vendor, _ = _group_vendor([(n, c.cpu) for n, c in hosts])
    models, evidence = _usable_everywhere(hosts, cmap)
    models = [m for m in models if "lm" in m.features and (not m.vendor or m.vendor == vendor)]
    if not models:
        raise NotEverywhere("cpu: no 64-bit CPU model is usable on every host of the group")
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
        # Only the features cpu_map marks removed from the model are disabled.
        GuestCPU(mode, model.name, vendor if model.vendor else "", (),
                 tuple(sorted(model.removed)), model.features),
        model.name,
        reason,
        (f"{len(models)} models usable on all {len(hosts)} hosts", *evidence[:6]),
    )


def host_cpu(
    hosts: Sequence[tuple[str, HostCapabilities]], cmap: CPUMap | None = None
) -> Decision[GuestCPU]:
    """host mode: the single host's host-model CPU, written out explicitly."""
    if len(hosts) != 1:
        raise InvalidInput(f"host needs exactly one host, got {len(hosts)}", field="mode")
    name, caps = hosts[0]
    cmap = cmap or load_cpu_map()
    d = baseline_cpu([(name, caps.cpu)], cmap, qemu_models_of(hosts), skippable=False)
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
        return baseline_cpu(
            [(n, c.cpu) for n, c in hosts], cmap, qemu_models=qemu_models_of(hosts),
            skippable=False,
        )
    if mode == "host":
        return host_cpu(hosts, cmap)
    if mode in ("software", "none"):
        return software_cpu(hosts, conservative=mode == "none", cmap=cmap)
    raise InvalidInput(f"{mode!r} is not one of {', '.join(MODES)}", field="mode")


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
        raise NotEverywhere(
            f"mode none uses policy {policy_version}'s model {model_name}, which is not "
            f"usable on {hosts_list(lacking)}", field="cpu",
        )
    return Decision(
        "cpu",
        # As everywhere: what cpu_map marks removed from the model is disabled.
        GuestCPU("none", model.name, "", require, tuple(sorted(model.removed - set(require))),
                 model.features | set(require)),
        model.name + "".join(f" +{f}" for f in require),
        f"mode none: policy {policy_version}'s fixed model, no host-specific features",
        (f"{model_name} usable on every host that lists its models",),
    )
