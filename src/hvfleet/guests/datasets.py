"""Which osinfo-db and cpu_map a guest was generated from, and where they are read.

The generator's output depends on two data sets besides the policy: the
osinfo-db (devices, firmware per OS) and libvirt's cpu_map (CPU models and
features). Their versions are recorded in the guest's metadata (policies
with `record_data_versions`), and each policy names the versions its golden
files were made with, so a changed data set is detected and named instead of
silently changing what a released policy produces. osinfo-db says its own
version (`VERSION`); cpu_map has none, so its version is a digest of its x86
files.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
from dataclasses import dataclass

from hvfleet.guests import datacache
from hvfleet.guests.cpumap import CPU_MAP_DIR
from hvfleet.guests.osinfo import OSINFO_DIR


@dataclass(frozen=True)
class DataSources:
    osinfo_dir: str = OSINFO_DIR
    cpu_map_dir: str = CPU_MAP_DIR

    def versions(self) -> dict[str, str]:
        return {"osinfo-db": osinfo_version(self.osinfo_dir),
                "cpu_map": cpu_map_version(self.cpu_map_dir)}


DEFAULT_DATA = DataSources()


@functools.lru_cache(maxsize=8)
def osinfo_version(directory: str) -> str:
    try:
        with open(os.path.join(directory, "VERSION")) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    if text:
        return text
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(directory, "os", "*", "*.xml"))):
        with open(path, "rb") as f:
            h.update(f.read())
    return "sha256:" + h.hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def cpu_map_version(directory: str) -> str:
    h = hashlib.sha256()
    files = [*glob.glob(os.path.join(directory, "x86_*.xml")), os.path.join(directory, "index.xml")]
    for path in sorted(files):
        try:
            with open(path, "rb") as f:
                h.update(os.path.basename(path).encode() + b"\0" + f.read())
        except OSError:
            continue
    return "sha256:" + h.hexdigest()[:16]


# A process that keeps them (the server, a CLI worker) hashes the files again
# once osinfo-db or cpu_map changed under it.
datacache.on_change(osinfo_version.cache_clear)
datacache.on_change(cpu_map_version.cache_clear)


def preload() -> None:
    """Load what the guest and CPU commands read, once per process (the API
    server, a CLI worker). Both call forms are warmed: the loaders cache per
    argument list, and the generator names the directories while other
    callers take the defaults."""
    from hvfleet.guests.cpumap import load_cpu_map
    from hvfleet.guests.osinfo import load_os_database

    load_cpu_map()
    load_os_database()
    load_cpu_map(DEFAULT_DATA.cpu_map_dir)
    load_os_database(DEFAULT_DATA.osinfo_dir)
    DEFAULT_DATA.versions()


def changed_versions(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """'cpu_map sha256:a → sha256:b' for each data set whose version differs."""
    return [f"{k} {recorded[k]} → {current.get(k, '?')}" for k in sorted(recorded)
            if recorded[k] != current.get(k)]
