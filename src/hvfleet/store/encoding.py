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
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import STORED_KINDS, Resource
from hvfleet.store.undecodable import Undecodable, reason_of, undecodable

# With sorted keys, the top-level "metadata" object is the first one: only
# "apiVersion" and "kind", whose values are plain strings, sort before it.
_METADATA = b'"metadata":{'

__all__ = ["Undecodable", "decode", "encode", "encode_and_read", "with_version"]


def encode(obj: Resource) -> bytes:
    """The stored bytes of `obj` (its resourceVersion left out); InvalidInput,
    naming the field, when a reader could not decode them."""
    return encode_and_read(obj)[0]


def encode_and_read(obj: Resource) -> tuple[bytes, Resource]:
    """`encode`, and the object a reader decodes from those bytes (without a
    resourceVersion): the check that readers accept them decodes them anyway,
    so a backend may hand that object to its watches instead of decoding the
    same bytes again (`with_version` of it at the write's revision is what
    `decode` would return)."""
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
    return raw, read


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
