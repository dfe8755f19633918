"""How an object is stored, the same in every backend.

An object is stored as its JSON (camelCase, sorted keys, no whitespace)
without `metadata.resourceVersion`: the backend's own revision of the write
(SQLite's counter, etcd's mod_revision) *is* the resourceVersion, so the two
can never disagree. Decoding puts it back from that revision.
"""

from __future__ import annotations

import json

from hvfleet.model.hypervisor import STORED_KINDS, Resource


def encode(obj: Resource) -> bytes:
    """The stored bytes of `obj` (its resourceVersion left out)."""
    data = obj.to_dict()
    data["metadata"].pop("resourceVersion", None)
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def decode(kind: str, value: bytes | str, revision: int) -> Resource:
    """The object stored as `value`, written at `revision`. (Parsing the JSON in
    pydantic and then setting the version is about 20% faster than json.loads
    and one validation of the dict, which matters when listing 10k objects.)"""
    return with_version(STORED_KINDS[kind].model_validate_json(value), revision)


def with_version(obj: Resource, revision: int) -> Resource:
    """`obj` as the backend wrote it at `revision`."""
    meta = obj.metadata.model_copy(update={"resource_version": str(revision)})
    return obj.model_copy(update={"metadata": meta})
