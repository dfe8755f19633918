"""The one lost-answer recovery (`etcd_transport.landed`), used by create,
update, delete, claim and write_all: a retried write whose compares failed
succeeded once exactly when its answer was lost and every key holds what it
meant to leave there."""

from __future__ import annotations

import pytest

from hvfleet.store.etcd_transport import KeyValue, TxnResult, landed


def kv(value: bytes, rev: int) -> list[KeyValue]:
    return [KeyValue(key="k", value=value, mod_revision=rev, create_revision=1, version=1)]


@pytest.mark.parametrize(("ambiguous", "ranges", "expected", "result"), [
    (True, [kv(b"mine", 7)], [b"mine"], 7),  # our earlier attempt landed
    (False, [kv(b"mine", 7)], [b"mine"], None),  # no lost answer: someone else's equal write
    (True, [kv(b"theirs", 7)], [b"mine"], None),  # a real conflict
    (True, [[]], [b"mine"], None),  # gone: not our put
    (True, [[]], [None], 9),  # our delete landed (revision of the answer)
    (True, [kv(b"x", 7)], [None], None),  # still there: not deleted by us
    (True, [kv(b"a", 8), kv(b"b", 8)], [b"a", b"b"], 8),  # a whole batch landed
    (True, [kv(b"a", 8), kv(b"c", 9)], [b"a", b"b"], None),  # one key of the batch differs
    (True, [kv(b"a", 8)], [b"a", b"b"], None),  # fewer answers than keys
])
def test_landed(ambiguous: bool, ranges: list[list[KeyValue]], expected: list[bytes | None],
                result: int | None) -> None:
    txn = TxnResult(succeeded=False, revision=9, ranges=ranges, ambiguous=ambiguous)
    assert landed(txn, expected) == result
