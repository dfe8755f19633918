"""What only the SQLite backend has: schema migrations, compaction, WAL."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from hvfleet.model import Gone, Hypervisor, InvalidInput, ObjectMeta, Unavailable
from hvfleet.store import open_store
from hvfleet.store import sqlite as sqlite_backend
from hvfleet.store.sqlite import MIGRATIONS, SqliteStore


def test_new_database_is_at_latest_schema_in_wal_mode(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "db"))
    assert store.schema_version() == len(MIGRATIONS)
    mode = sqlite3.connect(tmp_path / "db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    store.close()
    # Reopening migrates nothing and keeps the data.
    assert SqliteStore(str(tmp_path / "db")).schema_version() == len(MIGRATIONS)


def test_schema_newer_than_this_code_is_refused(tmp_path: Path) -> None:
    SqliteStore(str(tmp_path / "db")).close()
    db = sqlite3.connect(tmp_path / "db")
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(Unavailable, match="newer than this hvfleet"):
        SqliteStore(str(tmp_path / "db"))


def test_watch_from_compacted_revision_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_hypervisor: Callable[..., Hypervisor]
) -> None:
    monkeypatch.setattr(sqlite_backend, "EVENT_HISTORY", 5)
    monkeypatch.setattr(sqlite_backend, "_COMPACT_EVERY", 5)
    store = SqliteStore(str(tmp_path / "db"))
    for i in range(12):
        store.create(make_hypervisor(f"hv{i}"), "operator")
    with pytest.raises(Gone, match="compacted"):
        list(store.watch("Hypervisor", since=0, timeout=0.1))
    recent = list(store.watch("Hypervisor", since=store.revision() - 2, timeout=0.1))
    assert [e.object.metadata.name for e in recent] == ["hv10", "hv11"]


def test_store_urls(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="unsupported"):
        open_store("mysql://x")
    with pytest.raises(Unavailable, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/missing/dir/db")


def test_compaction_keeps_each_objects_last_write_below_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch from a revision above the floor still gets the previous state of
    an object last written below it (as etcd keeps each key's latest version)."""
    monkeypatch.setattr(sqlite_backend, "EVENT_HISTORY", 4)
    monkeypatch.setattr(sqlite_backend, "_COMPACT_EVERY", 2)
    store = SqliteStore(str(tmp_path / "db"))
    old = store.create(Hypervisor(metadata=ObjectMeta(name="old", labels={"rack": "a"})), "ops")
    gone = store.create(Hypervisor(metadata=ObjectMeta(name="gone")), "ops")
    store.delete("Hypervisor", "gone")
    for i in range(6):
        store.create(Hypervisor(metadata=ObjectMeta(name=f"f{i}")), "ops")
    since = store.revision()
    with pytest.raises(Gone):
        list(store.watch("Hypervisor", since=int(gone.metadata.resource_version or 0), timeout=0.1))
    store.update(old.model_copy(update={"metadata": old.metadata.model_copy(update={"labels": {}})}),
                 "ops")
    (event,) = store.watch("Hypervisor", since=since, timeout=0.2)
    assert event.type == "MODIFIED" and event.previous() == old
    # Only the last write of each live object stays below the floor.
    rows = store._read(lambda db: db.execute("SELECT name FROM events WHERE rev <= "
                                             "(SELECT value FROM meta WHERE key = 'compacted')"
                                             ).fetchall())
    assert sorted(r[0] for r in rows) == ["f0", "f1", "f2", "old"]  # floor 6: revisions 1, 4-6


def test_an_idle_watch_over_a_big_history_costs_next_to_no_cpu(tmp_path: Path) -> None:
    """A watch that waits for writes polls the store: each poll must be a look
    at the revision, not a walk over every stored event of its kind (20,000 at
    10,000 hosts: a few ms per poll, 20 polls a second per watch, which was
    most of an idle server's CPU). And a kind without writes does not walk
    the other kinds' events either."""
    import time

    from tests.dashboard.synthetic import seeded_store

    with open_store(seeded_store(tmp_path / "big.db", 10_000)) as store:
        for kind in ("Hypervisor", "OvercommitPolicy", None):
            # The watch's own CPU: a watch with a timeout polls in the calling
            # thread; the process's CPU also counted whatever threads earlier
            # tests of the run left winding down (142 ms once in a full run).
            t0 = time.thread_time()
            assert list(store.watch(kind, since=store.revision(), timeout=1.0)) == []
            spent = time.thread_time() - t0
            assert spent < 0.015, (kind, spent)  # about 4 ms; 40-50 ms walking the events
        # The watch from further back still delivers every event, in order.
        first = list(store.watch("Hypervisor", since=store.revision() - 3, timeout=0.2))
        assert [e.revision for e in first] == [store.revision() - 2, store.revision() - 1, store.revision()]


def test_the_change_mark_moves_with_every_commit_from_any_connection_and_only_then(
    tmp_path: Path, make_hypervisor: Callable[..., Hypervisor]
) -> None:
    """What the Placement snapshot trusts to answer without asking the
    revision: the mark stays while nothing is written, and moves with a write
    of this store, of another store over the same file (another replica, or
    process), and of a bare connection; a write under way leaves it (and the
    revision) as it was until it commits."""
    store = SqliteStore(str(tmp_path / "db"))
    other = SqliteStore(str(tmp_path / "db"))
    mark = store.change_mark()
    assert mark is not None and store.change_mark() == mark
    store.create(make_hypervisor("a"), "test")
    assert store.change_mark() not in (None, mark)
    mark = store.change_mark()
    store.get("Hypervisor", "a")
    store.revision()
    assert store.change_mark() == mark  # reads move nothing
    other.create(make_hypervisor("b"), "test")
    assert store.change_mark() != mark
    mark, revision = store.change_mark(), store.revision()
    bare = sqlite3.connect(tmp_path / "db", isolation_level=None)
    bare.execute("BEGIN IMMEDIATE")
    bare.execute("UPDATE meta SET value = value + 1 WHERE key = 'revision'")
    assert (store.change_mark(), store.revision()) == (mark, revision)  # not yet committed
    bare.execute("COMMIT")
    assert store.change_mark() != mark and store.revision() == revision + 1
    bare.close()
    other.close()
    store.close()
    assert store.change_mark() is None  # closed: ask the revision (which fails as closed)


def test_an_in_memory_store_has_no_change_mark() -> None:
    """Another connection to ":memory:" would be another database."""
    store = SqliteStore(":memory:")
    assert store.change_mark() is None
    store.close()
