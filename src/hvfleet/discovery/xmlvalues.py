"""Values written in libvirt's own XML syntax: memory sizes with a `unit`
attribute, and CPU / NUMA node sets (`0-3,^2,8`).

Both parsers are strict: a value libvirt itself would refuse raises
InvalidInput naming where it was found, so a domain we cannot read is skipped
instead of being counted wrong.
"""

from __future__ import annotations

from lxml import etree

from hvfleet.model.errors import InvalidInput

# libvirt's scaled-integer units (docs: formatdomain.html#memory-allocation).
# Without a unit, libvirt means KiB.
_UNITS: dict[str, int] = {
    "b": 1, "bytes": 1,
    "kb": 10**3, "k": 2**10, "kib": 2**10,
    "mb": 10**6, "m": 2**20, "mib": 2**20,
    "gb": 10**9, "g": 2**30, "gib": 2**30,
    "tb": 10**12, "t": 2**40, "tib": 2**40,
    "pb": 10**15, "p": 2**50, "pib": 2**50,
    "eb": 10**18, "e": 2**60, "eib": 2**60,
}
# No host has more than this; larger sets come from hostile or broken input and
# would cost unbounded memory to expand.
MAX_SET_MEMBER = 65535


def unit_bytes(unit: str | None, where: str) -> int:
    if unit is None or unit == "":
        return 2**10
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise InvalidInput(f"{where}: unknown memory unit {unit!r}")
    return factor


def memory_bytes(elem: etree._Element, where: str, default_unit: str = "KiB") -> int:
    """The size in bytes of an element like `<memory unit='MiB'>64</memory>`."""
    text = (elem.text or "").strip()
    if not text.isdecimal():
        raise InvalidInput(f"{where}: {text!r} is not a whole number")
    return int(text) * unit_bytes(elem.get("unit") or default_unit, where)


def size_kib(value: str | None, unit: str | None, where: str) -> int:
    """A page size (`size='2048' unit='KiB'`) in KiB."""
    text = (value or "").strip()
    if not text.isdecimal():
        raise InvalidInput(f"{where}: page size {text!r} is not a whole number")
    total = int(text) * unit_bytes(unit or "KiB", where)
    if total <= 0 or total % 1024:
        raise InvalidInput(f"{where}: page size {total} bytes is not a positive multiple of 1 KiB")
    return total // 1024


def parse_set(text: str | None, where: str) -> frozenset[int]:
    """A libvirt CPU or node set: `0-3,^2,8` → {0, 1, 3, 8}."""
    if text is None or not text.strip():
        raise InvalidInput(f"{where}: empty set")
    included: set[int] = set()
    excluded: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        target = included
        if part.startswith("^"):
            target, part = excluded, part[1:].strip()
        lo_text, sep, hi_text = part.partition("-")
        if not lo_text.isdecimal() or (sep and not hi_text.isdecimal()):
            raise InvalidInput(f"{where}: cannot parse {text!r} (expected e.g. 0-3,^2,8)")
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
        if hi < lo or hi > MAX_SET_MEMBER:
            raise InvalidInput(f"{where}: range {part!r} in {text!r} is out of order or too large")
        target.update(range(lo, hi + 1))
    result = frozenset(included - excluded)
    if not result:
        raise InvalidInput(f"{where}: {text!r} selects nothing")
    return result
