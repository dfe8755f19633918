"""How an object is stored, the same in every backend.

An object is stored as its JSON (camelCase, sorted keys, no whitespace)
without `metadata.resourceVersion`: the backend's own revision of the write
(SQLite's counter, etcd's mod_revision) *is* the resourceVersion, so the two
can never disagree. Decoding puts it back from that revision.

Every value a write stores is one every reader accepts: `encode` reads the
bytes it made back with the model every reader decodes with, so an object
built past the model's bounds (by code that copied it without validation)
is refused as InvalidInput naming the field, before anything is written.
A stored object that still does not decode raises `Undecodable` from
`decode` (hvfleet.store.undecodable says what each operation does then).

The JSON is followed by a seal in its trailing whitespace (`vouched`): 16
characters of space, tab, CR and LF that spell a CRC-32 of the object's kind,
name and JSON, seeded with a fingerprint of the model code (and pydantic's)
that checked them. JSON readers ignore trailing whitespace (an older
hvfleet's pydantic, Python's `json`), so the stored value is still the object;
a reader running the same model code knows from the seal, without decoding,
that the bytes are the API's JSON of an object it accepts (the follow path
sends them to watchers as they are: docs/etcd.md, "Sealed values"). Bytes
written by other model code, by hand, or changed since carry no valid seal
and are decoded as before, so an object this server cannot read is still
skipped by every watch.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from importlib import resources

import pydantic_core
from pydantic import ValidationError

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import STORED_KINDS, Resource
from hvfleet.store.undecodable import Undecodable, reason_of, undecodable

# With sorted keys, the top-level "metadata" object is the first one: only
# "apiVersion" and "kind", whose values are plain strings, sort before it.
_METADATA = b'"metadata":{'

__all__ = ["Undecodable", "decode", "encode", "encode_and_read", "vouched", "with_json_version",
           "with_version"]

# The seal's alphabet: JSON's four whitespace characters, two bits each.
_SEAL_DIGITS = b" \t\n\r"
_SEAL_LEN = 16
_FROM_SEAL = bytes.maketrans(_SEAL_DIGITS, b"0123")
# Each byte's four seal characters, most significant pair first.
_SEAL_OF_BYTE = [bytes(_SEAL_DIGITS[(byte >> shift) & 3] for shift in (6, 4, 2, 0)) for byte in range(256)]


def _model_fingerprint() -> int:
    """32 bits of a hash of the code that validates stored objects: every
    module of hvfleet.model (they import nothing else of hvfleet) and the
    pydantic-core version. Another build of the model, even one validator
    changed, seals differently, so its values are decoded here, not trusted."""
    digest = hashlib.sha256(pydantic_core.__version__.encode())
    package = resources.files("hvfleet.model")
    for entry in sorted(package.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".py"):
            digest.update(entry.name.encode() + b"\0" + entry.read_bytes() + b"\0")
    return int.from_bytes(digest.digest()[:4], "big")


_FINGERPRINT = _model_fingerprint()


def _crc(kind: str, name: str, raw: bytes) -> int:
    return zlib.crc32(raw, zlib.crc32(f"{kind}/{name}".encode(), _FINGERPRINT))


def _seal(kind: str, name: str, raw: bytes) -> bytes:
    """`raw` followed by its seal (see the module's docstring)."""
    crc = _crc(kind, name, raw)
    of = _SEAL_OF_BYTE
    return b"".join((raw, of[crc >> 24], of[(crc >> 16) & 255], of[(crc >> 8) & 255], of[crc & 255]))


def vouched(kind: str, name: str, value: bytes) -> bytes | None:
    """The JSON of `value` (stored as object `name` of `kind`) when its seal
    says this model code checked it, unchanged since: the API's JSON of an
    object `decode` accepts (without its resourceVersion); None for any other
    value (then only `decode` can tell)."""
    if len(value) <= _SEAL_LEN or value[-_SEAL_LEN - 1] != 0x7D:  # "}" before the seal
        return None
    try:
        crc = int(value[-_SEAL_LEN:].translate(_FROM_SEAL), 4)
    except ValueError:  # not whitespace of the seal's alphabet
        return None
    raw = value[:-_SEAL_LEN]
    return raw if crc == _crc(kind, name, raw) else None


def encode(obj: Resource) -> bytes:
    """The stored bytes of `obj` (its resourceVersion left out); InvalidInput,
    naming the field, when a reader could not decode them."""
    return encode_and_read(obj)[0]


def encode_and_read(obj: Resource) -> tuple[bytes, Resource]:
    """`encode`, and the object a reader decodes from those bytes (without a
    resourceVersion): the check that readers accept them decodes them anyway,
    so a backend may hand that object to its watches instead of decoding the
    same bytes again (`with_version` of it at the write's revision is what
    `decode` would return). The bytes carry the seal of this model code."""
    data = obj.to_dict()
    data["metadata"].pop("resourceVersion", None)
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    try:
        read = STORED_KINDS[obj.kind].model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "[key]") or None
        raise InvalidInput(
            f"{obj.kind} {obj.metadata.name}: {reason_of(exc)}", field=field
        ) from None
    return _seal(obj.kind, obj.metadata.name, raw), read


def with_json_version(raw: bytes, revision: int) -> bytes:
    """The stored JSON `raw` (as `vouched` gives it) with its resourceVersion
    spliced into its metadata: the object's JSON as the API sends it, equal in
    content to what `decode` of it at `revision` dumps (key order aside)."""
    at = raw.find(_METADATA)
    if at < 0:
        raise ValueError("not the stored encoding: no metadata object")
    at += len(_METADATA)
    sep = b"" if raw[at : at + 1] == b"}" else b","
    return b'%s"resourceVersion":"%d"%s%s' % (raw[:at], revision, sep, raw[at:])


def decode(kind: str, value: bytes | str, revision: int, name: str | None = None) -> Resource:
    """The object stored as `value`, written at `revision`; Undecodable when
    this hvfleet's model does not accept it.

    The resourceVersion is spliced into the JSON before pydantic parses it:
    one validation and no copies, which halves the cost of decoding (a list
    of 10k objects, or every Lease for agent liveness)."""
    raw = value.encode() if isinstance(value, str) else value
    try:
        at = raw.find(_METADATA)
        if at < 0:  # not the stored encoding: parse it, then set the version
            return with_version(STORED_KINDS[kind].model_validate_json(raw), revision)
        at += len(_METADATA)
        version = b'"resourceVersion":"%d"' % revision
        sep = b"" if raw[at : at + 1] == b"}" else b","
        return STORED_KINDS[kind].model_validate_json(raw[:at] + version + sep + raw[at:])
    except (ValidationError, ValueError, RecursionError) as exc:
        raise undecodable(kind, raw, revision, exc, name) from None


def with_version(obj: Resource, revision: int) -> Resource:
    """`obj` as the backend wrote it at `revision`."""
    meta = obj.metadata.model_copy(update={"resource_version": str(revision)})
    return obj.model_copy(update={"metadata": meta})
