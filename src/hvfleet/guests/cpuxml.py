"""Host CPUs read from XML documents: `<cpu>` files (`virsh cpu-baseline`
style), `<capabilities>` and `<domainCapabilities>` documents, and many raw
documents at once for a fleet-wide baseline, where only each document's
`<cpu>` part is read and each distinct CPU definition parsed once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from lxml import etree

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import HostCPU

# Children of a host <cpu> that differ between hosts of the same hardware and
# say nothing about its features (microcode revision, TSC frequency, topology,
# ...). Only self-closing ones whose attributes are plainly well formed, with
# nothing but whitespace between them and the tags around them, are matched:
# removing those changes no element's text. Anything else is left for the XML
# parser to judge.
_VOLATILE_RE = re.compile(
    r"(?<=>)\s*<(?:microcode|counter|topology|signature|maxphysaddr|cache|pages)"
    # No attribute twice (that is malformed, for the parser to refuse).
    r"(?![^<>]*?\s([\w.:-]+)\s*=[^<>]*\s\1\s*=)"
    r"""(?:\s+[A-Za-z_][\w.:-]*\s*=\s*(?:"[^"<&]*"|'[^'<&]*'))*\s*/>(?=\s*<)"""
)
# Whitespace between tags: indentation differs between libvirt versions and
# tools; values are read stripped, so it never carries meaning here.
_BETWEEN_TAGS_RE = re.compile(r">\s+<")
# The host CPU of a `virsh capabilities` document: the <cpu> right after
# <host> (and its <uuid>), before the host's NUMA topology with its <cpu id=>s.
_CAPS_HOST_CPU_RE = re.compile(
    r"\s*(?:<\?xml[^>]*\?>\s*)?<capabilities>\s*<host>\s*(?:<uuid>[^<]*</uuid>\s*)?"
    r"(<cpu>.*?</cpu>)",
    re.S,
)


def _cpu_part(text: str) -> str:
    """The part of a host XML document that the baseline needs: a
    `<capabilities>` document's host `<cpu>` element, less the children that
    differ between hosts of the same hardware. Documents in any other shape
    (comments, CDATA, DOCTYPE, other roots) are returned whole, to be parsed
    whole."""
    if "<!" in text:
        return text
    m = _CAPS_HOST_CPU_RE.match(text)
    if m:
        cpu = m.group(1)
        if cpu.count("<cpu") == 1:
            text = cpu
    # Only inside the <cpu> element(s): outside, a removal could turn a
    # malformed document (two roots) into a well-formed one.
    first = text.find("<cpu")
    inside = text.find(">", first)
    last = text.rfind("</cpu>")
    if first >= 0 and 0 <= inside < last:
        text = text[:inside] + _VOLATILE_RE.sub("", text[inside:last + 1]) + text[last + 1:]
    return _BETWEEN_TAGS_RE.sub("><", text)


# A bare host <cpu> document in its plainest form (after `_cpu_part`): child
# elements arch, model, vendor with plain text, and features with plainly
# quoted name (and policy) attributes, nothing else: no entity, no attribute
# whose value an XML parser would normalise, no duplicate attribute. Such a
# document means the same to any XML parser, so `_plain_cpu` reads it with
# regular expressions; anything else goes to the XML parser.
_PLAIN_VALUE = r"""(?:"([^"<&\t\n\r]*)"|'([^'<&\t\n\r]*)')"""
_PLAIN_CHILD = (
    r"<(arch|model|vendor)>([^<&]*)</\1>"
    rf"|<feature name={_PLAIN_VALUE}(?: policy={_PLAIN_VALUE})?/>"
    rf"|<feature policy={_PLAIN_VALUE} name={_PLAIN_VALUE}/>"
)
_PLAIN_CHILD_RE = re.compile(_PLAIN_CHILD)
_PLAIN_CPU_RE = re.compile(rf"<cpu>(?:{_PLAIN_CHILD})*</cpu>\s*")


def _plain_cpu(part: str, where: str) -> HostCPU | None:
    """The HostCPU of `part` if it is a plain `<cpu>` document, else None."""
    if _PLAIN_CPU_RE.fullmatch(part) is None:
        return None
    text: dict[str, str] = {}
    features: list[str] = []
    disabled: list[str] = []
    for tag, value, n1, n2, p1, p2, p3, p4, n3, n4 in _PLAIN_CHILD_RE.findall(part):
        if tag:
            text.setdefault(tag, value.strip())  # the first one, as find() takes
            continue
        # findall gives "" for groups that did not take part.
        name = n1 or n2 or n3 or n4
        if not name:
            return None  # let the parser's path refuse it, with its message
        policy = p1 or p2 or p3 or p4
        (disabled if policy in ("disable", "forbid") else features).append(name)
    return HostCPU(vendor=text.get("vendor", ""), model=text.get("model", ""),
                   features=features, disabled_features=disabled, source=where)


def cpus_from_texts(docs: Sequence[tuple[str, str]]) -> list[tuple[str, HostCPU]]:
    """(name, HostCPU) for (name, XML text) pairs.

    Only the `<cpu>` element is read: each document is cut down to the part
    that defines its CPU (`_cpu_part`), and documents whose CPU definitions
    are the same are parsed once. A fleet's documents are all distinct (a
    microcode line, a TSC frequency, a UUID per host) while its CPU
    definitions are a few dozen."""
    from hvfleet.discovery.xmlsafe import MAX_XML_BYTES, parse_xml

    parsed: dict[str, list[HostCPU]] = {}
    by_text: dict[str, list[HostCPU]] = {}
    out: list[tuple[str, HostCPU]] = []
    for name, text in docs:
        found = by_text.get(text)
        if found is None:
            if len(text) > MAX_XML_BYTES:
                raise InvalidInput(f"{name}: document is larger than {MAX_XML_BYTES} bytes")
            part = _cpu_part(text)
            found = parsed.get(part)
            if found is None:
                plain = _plain_cpu(part, name)
                found = [plain] if plain is not None else cpus_from_document(
                    parse_xml(part, name), name)
                parsed[part] = found
            by_text[text] = found
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
