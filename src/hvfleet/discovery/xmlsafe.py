"""Parsing XML from libvirt, files and users without trusting it.

Every XML document hvfleet reads goes through `parse_xml`: no DTD is loaded,
no entity is expanded, nothing is fetched from the network, and a document
that declares a DOCTYPE at all (the carrier of XXE and billion-laughs tricks)
is refused before parsing. libvirt never emits a DOCTYPE, so nothing real is lost.
"""

from __future__ import annotations

import re

from lxml import etree

from hvfleet.model.errors import InvalidInput

MAX_XML_BYTES = 16 * 1024 * 1024
_DOCTYPE_RE = re.compile(rb"<!DOCTYPE|<!ENTITY", re.IGNORECASE)


def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )


def parse_xml(data: str | bytes, what: str = "XML") -> etree._Element:
    """Parse `data` (named `what` in errors) into an element, or raise InvalidInput."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_XML_BYTES:
        raise InvalidInput(f"{what}: document is larger than {MAX_XML_BYTES} bytes")
    if _DOCTYPE_RE.search(raw):
        raise InvalidInput(f"{what}: DOCTYPE or ENTITY declarations are not accepted")
    try:
        root = etree.fromstring(raw, _parser())
    except etree.XMLSyntaxError as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise InvalidInput(f"{what}: malformed XML{where}: {exc.msg}") from None
    if root is None:
        raise InvalidInput(f"{what}: empty document")
    return root


def read_xml_file(path: str, what: str | None = None) -> etree._Element:
    label = what or path
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_XML_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"{label}: cannot read: {exc.strerror}") from None
    return parse_xml(data, label)
