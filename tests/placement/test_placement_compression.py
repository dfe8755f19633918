"""A large Placement answer (the allocation candidates of a few hundred
providers) goes out gzip-encoded to a client that takes gzip, and decodes to
the very bytes a client that does not take it gets; small answers, and
clients that do not ask or refuse gzip, get identity."""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model.meta import ObjectMeta
from hvfleet.model.placement import PlacementInventory, ResourceProvider, ResourceProviderSpec
from hvfleet.server.placement import compression
from hvfleet.server.placement.compression import GzipKept, accepts_gzip
from hvfleet.store.base import Write
from tests.placement.support import Placement, _served_sqlite

LARGE = "/allocation_candidates?resources=VCPU:1,MEMORY_MB:1024"
SMALL = "/allocation_candidates?resources=VCPU:1,MEMORY_MB:1024&limit=2"


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    for served in _served_sqlite(seeded=False):
        writes = []
        for i in range(400):  # ~450 bytes of answer each: past 128 KiB
            u = str(uuid.UUID(int=i + 1))
            spec = ResourceProviderSpec(provider_name=f"cn{i:04d}", root_uuid=u, generation=1, inventories={
                "VCPU": PlacementInventory(total=64), "MEMORY_MB": PlacementInventory(total=65536)})
            writes.append(Write("create", ResourceProvider(metadata=ObjectMeta(name=u), spec=spec)))
        served.store.write_all(writes, "test")
        yield served


def _get(api: Placement, path: str, accept_encoding: str | None) -> requests.Response:
    # None: no Accept-Encoding at all (requests would send its own "gzip, deflate").
    headers = {"X-Auth-Token": api.tokens["admin"], "OpenStack-API-Version": "placement 1.39",
               "Accept": "application/json", "Accept-Encoding": accept_encoding}
    # The bytes as they came: requests would decode them itself.
    r = requests.get(f"{api.url}/placement{path}", headers=headers, verify=str(api.ca), timeout=30,
                     stream=True)
    r._content = r.raw.read(decode_content=False)
    return r


def test_a_large_answer_is_gzip_for_a_client_that_takes_it_and_decodes_to_the_same_bytes(
        api: Placement) -> None:
    plain = _get(api, LARGE, "identity")
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    assert len(plain.content) >= compression.MIN_BYTES
    assert "accept-encoding" in plain.headers["vary"].lower()
    for asked in ("gzip, deflate", "gzip", "br;q=1, gzip;q=0.5", "*"):
        for _ in range(2):  # made, then kept
            packed = _get(api, LARGE, asked)
            assert packed.status_code == 200 and packed.headers["content-encoding"] == "gzip", asked
            assert len(packed.content) < len(plain.content) / 4
            assert gzip.decompress(packed.content) == plain.content
            assert int(packed.headers["content-length"]) == len(packed.content)
    # What a requests client (Nova's, under keystoneauth) reads: the same JSON.
    assert requests.get(f"{api.url}/placement{LARGE}", headers={
        "X-Auth-Token": api.tokens["admin"], "OpenStack-API-Version": "placement 1.39"},
        verify=str(api.ca), timeout=30).json() == plain.json()


@pytest.mark.parametrize("asked", [None, "identity", "deflate", "gzip;q=0", "*;q=0", "br"])
def test_a_client_that_does_not_take_gzip_gets_identity(api: Placement, asked: str | None) -> None:
    r = _get(api, LARGE, asked)
    assert r.status_code == 200 and "content-encoding" not in r.headers
    assert len(r.json()["allocation_requests"]) == 400


def test_a_small_answer_is_never_compressed(api: Placement) -> None:
    r = _get(api, SMALL, "gzip, deflate")
    assert r.status_code == 200 and "content-encoding" not in r.headers
    assert len(r.json()["allocation_requests"]) == 2
    assert r.headers["vary"] == "openstack-api-version"


def test_a_compressed_body_is_kept_by_the_identity_of_its_body() -> None:
    kept = GzipKept(kept=2)
    a, b, c = (bytes([k]) * 200_000 for k in (1, 2, 3))
    assert kept.kept(a) is None
    packed = kept.compress(a)
    assert kept.kept(a) is packed and kept.compress(a) is packed
    assert kept.kept(bytes(bytearray(a))) is None  # equal bytes, another body: not this one's
    kept.compress(b)
    kept.compress(c)
    assert kept.kept(a) is None and gzip.decompress(kept.compress(c)) == c  # the oldest went


NAMES = st.sampled_from(["gzip", "GZIP", "x-gzip", "deflate", "br", "identity", "*", "compress"])
QS = st.one_of(st.none(), st.sampled_from(["0", "0.0", "0.5", "1", "1.0", "0.001", "junk"]))


@given(st.lists(st.tuples(NAMES, QS), max_size=5), st.sampled_from([",", ", ", " , "]))
def test_accept_encoding_takes_gzip_as_its_most_specific_entry_says(
        entries: list[tuple[str, str | None]], sep: str) -> None:
    header = sep.join(name if q is None else f"{name};q={q}" for name, q in entries)

    def weight(q: str | None) -> float:
        try:
            return 1.0 if q is None else float(q)
        except ValueError:
            return 0.0

    last = {name.lower(): weight(q) for name, q in entries}  # a repeated name: its last entry
    want = next((last[n] > 0 for n in ("gzip", "x-gzip") if n in last), last.get("*", 0) > 0)
    assert accepts_gzip(header) is want
