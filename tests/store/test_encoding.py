"""The stored encoding (hvfleet.store.encoding), shared by every backend."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model import Hypervisor, Reservation
from hvfleet.model.lease import Lease, LeaseSpec
from hvfleet.model.meta import ObjectMeta
from hvfleet.store.encoding import decode, encode, with_version

names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
# Annotation values may contain anything, the splice's marker included.
values = st.one_of(st.text(max_size=30), st.just('"metadata":{'), st.just('{"metadata":{}}'))


@given(names, st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), values, max_size=3),
       st.integers(1, 2**62))
def test_decode_gives_back_what_was_encoded_at_the_revision(
    name: str, notes: dict[str, str], rev: int
) -> None:
    objects = [
        Hypervisor(metadata=ObjectMeta(name=name, annotations=notes)),
        Reservation.model_validate({"metadata": {"name": name, "annotations": notes}, "spec": {
            "hypervisor": "hv1", "consumer": "c", "resources": {"cpu": 1}}}),
        Lease(metadata=ObjectMeta(name=name, annotations=notes),
              spec=LeaseSpec(holder_identity=f"agent/{name}", renew_time=datetime.now(UTC))),
    ]
    for obj in objects:
        stored = encode(with_version(obj, 7))
        assert b"resourceVersion" not in stored
        assert json.loads(stored)["metadata"]["annotations"] == notes
        back = decode(obj.kind, stored, rev)
        assert back == with_version(obj, rev)
        assert decode(obj.kind, stored.decode(), rev) == back
