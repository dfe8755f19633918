"""libvirt's own x86 CPU model definitions (`/usr/share/libvirt/cpu_map/`).

The baseline is computed against the same model and feature names libvirt
uses, so the `<cpu>` we write means exactly what libvirt will check: every
named model's full feature set (features inherited through `<model name=.../>`
included), the feature list with QEMU aliases, and which features libvirt
marks non-migratable. A feature marked `removed='yes'` in a model is no longer
part of it (QEMU dropped it from that model, e.g. intel-pt from the Icelake
models, monitor from EPYC): it is kept apart in `removed`, so that a host of
that model is not taken to have it, and a guest of that model disables it
explicitly, as libvirt's own baseline does.
"""

from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass
from typing import Any

from hvfleet.discovery.xmlsafe import read_xml_file
from hvfleet.model.errors import InvalidInput

CPU_MAP_DIR = "/usr/share/libvirt/cpu_map"


@dataclass(frozen=True)
class CPUModel:
    name: str
    vendor: str  # "" for vendor-neutral models (qemu64, kvm64, ...)
    features: frozenset[str]  # without the removed ones
    position: int  # order in index.xml: later means newer within a family
    # Features the model once had and libvirt marks removed='yes'.
    removed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CPUMap:
    features: tuple[str, ...]
    non_migratable: frozenset[str]
    aliases: dict[str, str]  # alternative spelling → libvirt name
    models: dict[str, CPUModel]
    vendors: tuple[str, ...]

    def canonical_feature(self, name: str) -> str:
        return self.aliases.get(name, name)

    def model(self, name: str, where: str) -> CPUModel:
        try:
            return self.models[name]
        except KeyError:
            raise InvalidInput(
                f"{where}: CPU model {name!r} is not in libvirt's cpu_map"
            ) from None


def _load(directory: str) -> CPUMap:
    index = read_xml_file(os.path.join(directory, "index.xml"), "cpu_map index.xml")
    arch = next((a for a in index.findall("arch") if a.get("name") == "x86"), None)
    if arch is None:
        raise InvalidInput(f"{directory}/index.xml: no x86 arch")
    features: list[str] = []
    non_migratable: set[str] = set()
    aliases: dict[str, str] = {}
    raw_models: list[tuple[str, str, list[str], list[str], list[str]]] = []
    vendors: list[str] = []
    for inc in arch.findall("include"):
        fname = inc.get("filename", "")
        doc = read_xml_file(os.path.join(directory, fname), f"cpu_map {fname}")
        for v in doc.findall("vendor"):
            vendors.append(v.get("name", ""))
        for f in doc.findall("feature"):
            name = f.get("name", "")
            features.append(name)
            if f.get("migratable") == "no":
                non_migratable.add(name)
            for a in f.findall("alias"):
                aliases[a.get("name", "")] = name
            # Underscore/dash spellings are interchangeable in QEMU.
            aliases.setdefault(name.replace("_", "-"), name)
            aliases.setdefault(name.replace("-", "_"), name)
        for m in doc.findall("model"):
            vendor_el = m.find("vendor")
            parents = [p.get("name", "") for p in m.findall("model")]
            raw_models.append(
                (
                    m.get("name", ""),
                    vendor_el.get("name", "") if vendor_el is not None else "",
                    [f.get("name", "") for f in m.findall("feature")
                     if f.get("removed") != "yes"],
                    parents,
                    [f.get("name", "") for f in m.findall("feature")
                     if f.get("removed") == "yes"],
                )
            )
    # A name cpu_map itself uses is never taken as an alias: the baseline
    # relies on a model's features being spelled as they are (guests/cpu.py).
    for name in features:
        aliases.pop(name, None)
    for _, _, feats, _, removed in raw_models:
        for name in (*feats, *removed):
            aliases.pop(name, None)
    models: dict[str, CPUModel] = {}
    for pos, (name, vendor, feats, parents, removed) in enumerate(raw_models):
        inherited: set[str] = set()
        gone = set(removed)
        for p in parents:
            if p not in models:
                raise InvalidInput(f"cpu_map: model {name!r} inherits unknown model {p!r}")
            inherited |= models[p].features
            gone |= models[p].removed
            vendor = vendor or models[p].vendor
        # A model that lists a feature its parent had removed has it again.
        own = (inherited | set(feats)) - set(removed)
        models[name] = CPUModel(name, vendor, frozenset(own), pos, frozenset(gone - own))
    return CPUMap(tuple(features), frozenset(non_migratable), aliases, models, tuple(vendors))


def _dump(cmap: CPUMap) -> dict[str, Any]:
    return {
        "features": list(cmap.features),
        "non_migratable": sorted(cmap.non_migratable),
        "aliases": cmap.aliases,
        "models": [
            [m.name, m.vendor, sorted(m.features), m.position, sorted(m.removed)]
            for m in cmap.models.values()
        ],
        "vendors": list(cmap.vendors),
    }


def _undump(doc: dict[str, Any]) -> CPUMap:
    models = {
        name: CPUModel(name, vendor, frozenset(feats), pos, frozenset(removed))
        for name, vendor, feats, pos, removed in doc["models"]
    }
    return CPUMap(
        tuple(doc["features"]),
        frozenset(doc["non_migratable"]),
        dict(doc["aliases"]),
        models,
        tuple(doc["vendors"]),
    )


@functools.lru_cache(maxsize=4)
def load_cpu_map(directory: str = CPU_MAP_DIR) -> CPUMap:
    """The x86 cpu_map in `directory`: parsed once per process, and kept in the
    on-disk cache (`datacache`) across processes while its files are unchanged."""
    from hvfleet.guests import datacache

    return datacache.cached(
        "cpu_map",
        directory,
        sources=sorted(glob.glob(os.path.join(directory, "*.xml"))),
        code=[__file__, datacache.__file__],
        build=lambda: _load(directory),
        dump=_dump,
        load=_undump,
        forget=load_cpu_map.cache_clear,
    )
