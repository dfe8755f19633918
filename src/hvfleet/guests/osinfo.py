"""What the generator knows about a guest OS, from Debian's osinfo-db.

The database (`/usr/share/osinfo/os/*/*.xml`) is read once per process (and
its parsed tables kept on disk by `datacache` while the files are unchanged),
with `derives-from` inheritance: an OS sees the devices and firmware of the OS it
derives from unless it overrides them (`supported="false"` removes). Only the
facts the policies use are kept. In-box support is what matters: a device
only reachable through extra drivers (virtio-win for Windows) does not count,
because the installer would not see a disk on it.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hvfleet.discovery.xmlsafe import read_xml_file
from hvfleet.model.errors import InvalidInput

if TYPE_CHECKING:
    from lxml import etree

OSINFO_DIR = "/usr/share/osinfo"

# osinfo device ids for what the policies ask about (legacy and virtio 1.0 ids).
DEVICE_IDS: dict[str, tuple[str, ...]] = {
    "virtio-block": ("http://pcisig.com/pci/1af4/1001", "http://pcisig.com/pci/1af4/1042"),
    "virtio-net": ("http://pcisig.com/pci/1af4/1000", "http://pcisig.com/pci/1af4/1041"),
    "virtio-balloon": ("http://pcisig.com/pci/1af4/1002", "http://pcisig.com/pci/1af4/1045"),
    "virtio-rng": ("http://pcisig.com/pci/1af4/1005", "http://pcisig.com/pci/1af4/1044"),
    "virtio-gpu": ("http://pcisig.com/pci/1af4/1050",),
    "qemu-xhci": ("http://pcisig.com/pci/1b36/0004", "http://pcisig.com/pci/1b36/000d"),
    "q35": ("http://qemu.org/chipset/x86/q35",),
    "e1000e": ("http://pcisig.com/pci/8086/10d3",),
    "usb-tablet": ("http://usb.org/usb/80ee/0021",),
}


@dataclass(frozen=True)
class OSInfo:
    short_id: str
    os_id: str
    name: str
    family: str
    distro: str
    version: str
    release_date: str
    lineage: tuple[str, ...]  # short ids from this OS up its derives-from chain
    device_source: str  # the nearest OS in the lineage that lists devices
    devices: frozenset[str]  # in-box device ids, inherited
    driver_devices: frozenset[str]  # ids reachable only through extra drivers
    firmware: dict[str, bool]  # x86_64 firmware type → supported
    min_ram: int | None
    min_cpus: int | None

    @property
    def is_windows(self) -> bool:
        return self.family in ("winnt", "win9x", "win16") or self.distro == "win"

    @property
    def is_linux(self) -> bool:
        return self.family == "linux"

    def supports(self, device: str) -> bool:
        return any(i in self.devices for i in DEVICE_IDS[device])

    def via_driver(self, device: str) -> bool:
        return any(i in self.driver_devices for i in DEVICE_IDS[device])

    def needs_efi(self) -> bool:
        return self.firmware.get("efi") is True and self.firmware.get("bios") is False

    def device_evidence(self, device: str) -> str:
        if self.supports(device):
            return f"osinfo {self.short_id}: {device} in-box (device list of {self.device_source})"
        if self.via_driver(device):
            return f"osinfo {self.short_id}: {device} only through extra drivers (not in-box)"
        return f"osinfo {self.short_id}: no {device} device listed"


@dataclass
class _Raw:
    os_id: str
    short_ids: list[str]
    name: str
    family: str
    distro: str
    version: str
    release_date: str
    parent: str | None
    devices: dict[str, bool]
    drivers: set[str]
    firmware: dict[str, bool]
    min_ram: int | None
    min_cpus: int | None


def _child_text(el: etree._Element, tag: str) -> str:
    for c in el.findall(tag):
        if c.get("{http://www.w3.org/XML/1998/namespace}lang") is None:
            return (c.text or "").strip()
    return ""


def _parse_os(el: etree._Element, drivers: set[str]) -> _Raw:
    devices: dict[str, bool] = {}
    for d in el.findall("devices/device"):
        devices[d.get("id", "")] = d.get("supported") != "false"
    firmware: dict[str, bool] = {}
    for fw in el.findall("firmware"):
        if fw.get("arch") in ("x86_64", None):
            firmware[fw.get("type", "")] = fw.get("supported") != "false"
    min_ram = min_cpus = None
    for res in el.findall("resources"):
        if res.get("arch") in ("x86_64", "all", None):
            ram = res.findtext("minimum/ram")
            cpus = res.findtext("minimum/n-cpus")
            min_ram = int(ram) if ram and ram.isdecimal() else min_ram
            min_cpus = int(cpus) if cpus and cpus.isdecimal() else min_cpus
    parent = el.find("derives-from")
    return _Raw(
        os_id=el.get("id", ""),
        short_ids=[(s.text or "").strip() for s in el.findall("short-id")],
        name=_child_text(el, "name"),
        family=_child_text(el, "family"),
        distro=_child_text(el, "distro"),
        version=_child_text(el, "version"),
        release_date=_child_text(el, "release-date"),
        parent=parent.get("id") if parent is not None else None,
        devices=devices,
        drivers=drivers,
        firmware=firmware,
        min_ram=min_ram,
        min_cpus=min_cpus,
    )


def _parse_tables(directory: str) -> tuple[dict[str, _Raw], dict[str, str]]:
    raw_by_id: dict[str, _Raw] = {}
    by_short: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(directory, "os", "*", "*.xml"))):
        drivers: set[str] = set()
        for dpath in sorted(glob.glob(path[:-4] + ".d/*.xml")):
            droot = read_xml_file(dpath, f"osinfo {dpath}")
            drivers |= {d.get("id", "") for d in droot.iter("device")}
        for el in read_xml_file(path, f"osinfo {path}").findall("os"):
            raw = _parse_os(el, drivers)
            raw_by_id[raw.os_id] = raw
            for s in raw.short_ids:
                by_short.setdefault(s, raw.os_id)
    return raw_by_id, by_short


def _dump(tables: tuple[dict[str, _Raw], dict[str, str]]) -> dict[str, Any]:
    raw_by_id, by_short = tables
    rows = []
    for r in raw_by_id.values():
        row = dataclasses.asdict(r)
        row["drivers"] = sorted(r.drivers)
        rows.append(row)
    return {"raw": rows, "by_short": by_short}


def _undump(doc: dict[str, Any]) -> tuple[dict[str, _Raw], dict[str, str]]:
    raw_by_id: dict[str, _Raw] = {}
    for row in doc["raw"]:
        r = _Raw(**{**row, "drivers": set(row["drivers"])})
        raw_by_id[r.os_id] = r
    return raw_by_id, dict(doc["by_short"])


class OSDatabase:
    def __init__(self, directory: str = OSINFO_DIR) -> None:
        from hvfleet.guests import datacache

        self.directory = directory
        self._cache: dict[str, OSInfo] = {}
        os_dir = os.path.join(directory, "os")
        sources = datacache.tree_files(os_dir)
        if not sources:
            raise InvalidInput(f"osinfo: no OS definitions under {directory}/os")
        # Parsing ~800 files takes longer than the rest of a guest generation:
        # the parsed tables are kept on disk while the files are unchanged.
        self._raw, self._by_short = datacache.cached(
            "osinfo",
            directory,
            sources=[*sources, os.path.join(directory, "VERSION")],
            code=[__file__, datacache.__file__],
            build=lambda: _parse_tables(directory),
            dump=_dump,
            load=_undump,
            forget=load_os_database.cache_clear,
        )

    @property
    def short_ids(self) -> list[str]:
        return sorted(self._by_short)

    def get(self, short_id: str) -> OSInfo:
        if short_id not in self._by_short:
            import difflib  # only for the hint

            close = difflib.get_close_matches(short_id, self.short_ids, n=5, cutoff=0.6)
            hint = f"; closest: {', '.join(close)}" if close else ""
            raise InvalidInput(f"unknown OS id {short_id!r} in osinfo-db{hint}", field="os")
        os_id = self._by_short[short_id]
        if os_id not in self._cache:
            self._cache[os_id] = self._resolve(os_id, short_id)
        return self._cache[os_id]

    def _resolve(self, os_id: str, short_id: str) -> OSInfo:
        chain: list[_Raw] = []
        seen: set[str] = set()
        cur: str | None = os_id
        while cur and cur in self._raw and cur not in seen:
            seen.add(cur)
            chain.append(self._raw[cur])
            cur = self._raw[cur].parent
        devices: dict[str, bool] = {}
        firmware: dict[str, bool] = {}
        drivers: set[str] = set()
        device_source = chain[0].short_ids[0] if chain[0].short_ids else short_id
        for raw in reversed(chain):  # base first, nearest OS wins
            devices.update(raw.devices)
            firmware.update(raw.firmware)
            drivers |= raw.drivers
            if any(raw.devices.values()) and raw.short_ids:
                device_source = raw.short_ids[0]
        me = chain[0]
        in_box = frozenset(d for d, ok in devices.items() if ok)
        return OSInfo(
            short_id=short_id,
            os_id=os_id,
            name=me.name,
            family=next((r.family for r in chain if r.family), ""),
            distro=next((r.distro for r in chain if r.distro), ""),
            version=me.version,
            release_date=me.release_date,
            lineage=tuple(r.short_ids[0] for r in chain if r.short_ids),
            device_source=device_source,
            devices=in_box,
            driver_devices=frozenset(drivers - in_box),
            firmware=firmware,
            min_ram=next((r.min_ram for r in chain if r.min_ram), None),
            min_cpus=next((r.min_cpus for r in chain if r.min_cpus), None),
        )


@functools.lru_cache(maxsize=2)
def load_os_database(directory: str = OSINFO_DIR) -> OSDatabase:
    return OSDatabase(directory)


def os_info(short_id: str) -> OSInfo:
    return load_os_database().get(short_id)
