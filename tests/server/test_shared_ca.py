"""One CA for every replica over one store (hvfleet.server.tls.shared_signer),
kept as a server secret no kind or API role reaches, and its rotation in three
steps: real TLS handshakes on 127.0.0.1 with the files each replica writes."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from hvfleet.model.errors import InvalidInput
from hvfleet.server.tls import (
    SHARED_CA,
    ServingFiles,
    ensure_serving_certificate,
    rotate_shared_ca,
    shared_signer,
)
from hvfleet.store import Store, open_store
from tests.server.tls_files import handshake


def _replica(store: Store, data_dir: Path) -> ServingFiles:
    return ensure_serving_certificate(data_dir, "127.0.0.1", shared=shared_signer(store, data_dir))


def _verifies(files: ServingFiles, trusting: bytes, tmp: Path) -> bool:
    ca = tmp / f"trust-{abs(hash(trusting))}.pem"
    ca.write_bytes(trusting)
    try:
        return handshake(ServingFiles(files.cert, files.key, ca), "127.0.0.1", "127.0.0.1") == "hello"
    except ssl.SSLCertVerificationError:
        return False


def test_replicas_over_one_store_share_one_ca_seeded_from_the_first_data_dir(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/hvfleet.db")
    # A replica that ran before sharing existed keeps its CA: kubeconfigs made for it stay valid.
    before = ensure_serving_certificate(tmp_path / "a", "127.0.0.1")
    assert before.ca is not None
    old_ca = before.ca.read_bytes()
    a, b = _replica(store, tmp_path / "a"), _replica(store, tmp_path / "b")
    assert a.ca is not None and b.ca is not None
    assert a.ca.read_bytes() == b.ca.read_bytes() == old_ca
    assert not (tmp_path / "b" / "tls" / "ca.key").exists()  # the CA's key stays in the store
    assert _verifies(b, old_ca, tmp_path)
    # No list of any kind shows it.
    assert all(not store.list(kind).items for kind in ("Hypervisor", "Lease", "OvercommitPolicy"))
    assert store.server_secret(SHARED_CA) is not None
    store.close()


def test_a_rotation_trusts_both_then_switches_then_drops_the_old(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/hvfleet.db")
    a = _replica(store, tmp_path / "a")
    assert a.ca is not None
    old_trust = a.ca.read_bytes()
    with pytest.raises(InvalidInput, match="begin first"):
        rotate_shared_ca(store, "switch")
    begun = rotate_shared_ca(store, "begin")
    # The step's words say to restart the replicas before kubeconfigs are handed out:
    # a replica only serves the new trust bundle once restarted (probe 14).
    assert "beside" in begun and begun.index("restart each replica") < begun.index("kubeconfigs")
    a = _replica(store, tmp_path / "a")  # a restart: still signed by the old CA, both trusted
    assert a.ca is not None
    both = a.ca.read_bytes()
    assert both.startswith(old_trust) and both.count(b"BEGIN CERTIFICATE") == 2
    assert _verifies(a, old_trust, tmp_path)
    rotate_shared_ca(store, "switch")
    a = _replica(store, tmp_path / "a")  # re-issued by the new CA
    assert a.ca is not None
    assert _verifies(a, both, tmp_path) and not _verifies(a, old_trust, tmp_path)
    rotate_shared_ca(store, "end")
    a = _replica(store, tmp_path / "a")
    assert a.ca is not None
    new_only = a.ca.read_bytes()
    assert new_only.count(b"BEGIN CERTIFICATE") == 1 and new_only not in old_trust
    assert _verifies(a, new_only, tmp_path)
    with pytest.raises(InvalidInput, match="not one of"):
        rotate_shared_ca(store, "restart")
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
def test_a_server_secret_is_set_once_then_only_by_its_version(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "etcd":
        cluster = request.getfixturevalue("etcd_session")
        url = cluster.url(prefix=f"/secret-{tmp_path.name[-12:]}")
    else:
        url = f"sqlite:///{tmp_path}/hvfleet.db"
    store = open_store(url)
    assert store.server_secret("x") is None
    assert store.put_server_secret("x", b"one", None)
    assert not store.put_server_secret("x", b"two", None)  # another replica came first
    value, version = store.server_secret("x") or (b"", 0)
    assert value == b"one"
    assert not store.put_server_secret("x", b"three", version + 1)
    assert store.put_server_secret("x", b"three", version)
    assert (store.server_secret("x") or (b"", 0))[0] == b"three"
    if backend == "sqlite":
        assert store.revision() == 0  # no object written, no event for a watch
    store.close()


def test_a_replica_behind_a_load_balancer_serves_the_balancers_name_too(tmp_path: Path) -> None:
    from hvfleet.server.__main__ import options_from_json
    from hvfleet.server.serve import plan_tls

    store = open_store(f"sqlite:///{tmp_path}/hvfleet.db")
    options = options_from_json(
        '{"data_dir": "%s", "tls_names": ["fleet.example"]}' % (tmp_path / "a"))
    files = plan_tls(options, "127.0.0.1", store)
    assert files is not None
    assert handshake(files, "127.0.0.1", "fleet.example") == "hello"
    with pytest.raises(InvalidInput, match="tls_names"):
        options_from_json('{"tls_names": "fleet.example"}')
    store.close()
