"""Loading a host group: from a directory of saved libvirt XML, or from the store."""

from __future__ import annotations

import os

from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.discovery.xmlsafe import MAX_XML_BYTES
from hvfleet.guests.request import HostGroup
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import HostCapabilities


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_XML_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not UTF-8 text") from None


def load_caps_dir(directory: str) -> HostGroup:
    """`<host>.caps.xml` (+ optional `<host>.domcaps.xml`) per host in `directory`."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise InvalidInput(f"{directory}: {exc.strerror}", field="caps_dir") from None
    hosts: list[tuple[str, HostCapabilities]] = []
    for fname in names:
        if not fname.endswith(".caps.xml"):
            continue
        host = fname[: -len(".caps.xml")]
        caps_path = os.path.join(directory, fname)
        dom_path = os.path.join(directory, f"{host}.domcaps.xml")
        domcaps = _read(dom_path) if os.path.exists(dom_path) else None
        try:
            caps = parse_host_capabilities(_read(caps_path), domcaps)
        except InvalidInput as exc:
            raise InvalidInput(f"{directory}: host {host}: {exc}") from None
        hosts.append((host, caps))
    if not hosts:
        raise InvalidInput(f"{directory}: no <host>.caps.xml files", field="caps_dir")
    return HostGroup(tuple(hosts))


def group_from_store(hypervisors: list[tuple[str, HostCapabilities | None]]) -> HostGroup:
    lacking = [n for n, c in hypervisors if c is None]
    if lacking:
        raise InvalidInput(
            f"no status.hostCapabilities yet for {', '.join(lacking)} (has their agent run?)",
            field="hosts",
        )
    return HostGroup(tuple((n, c) for n, c in hypervisors if c is not None))
