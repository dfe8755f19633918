"""A SQLite store of `n` synthetic hosts (fleet.seed_synthetic), seeded once
and copied for each use.

Seeding 10,000 hosts through the Store takes two checked writes per host (a
create as the host's agent, its spec by an operator): about a minute on the
2-core machine, which was most of the 10k dashboard tests' time. The seeded
file is kept under build/synthetic/, named by the host count, the seed and a
digest of the code that decides what is stored (hvfleet.model,
hvfleet.store, fleet.py): any change there seeds again. A copy is made with
SQLite's backup API, so it is a consistent database whatever the template's
WAL holds.

Hosts copied from an older template have an old heartbeat, so they show as
Stale; a freshly seeded fleet turns Stale three resync periods after it was
seeded. The tests using it hold either way.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
from pathlib import Path

from tests.dashboard.fleet import ROOT, seed_synthetic

CACHE = ROOT / "build" / "synthetic"
_SOURCES = (ROOT / "src" / "hvfleet" / "model", ROOT / "src" / "hvfleet" / "store",
            Path(__file__).with_name("fleet.py"))


def _digest() -> str:
    h = hashlib.sha256()
    for source in _SOURCES:
        files = sorted(source.rglob("*.py")) if source.is_dir() else [source]
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def template(n: int, seed_: int = 1) -> Path:
    """The seeded store file for (`n`, `seed_`), seeded now if there is none
    for the current code."""
    path = CACHE / f"hosts-{n}-seed-{seed_}-{_digest()}.db"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob(f"hosts-{n}-seed-{seed_}-*.db"):
        old.unlink(missing_ok=True)  # made by older code
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        fresh = Path(tmp) / "hvfleet.db"
        seed_synthetic(f"sqlite:///{fresh}", n, seed_)
        _copy(fresh, Path(tmp) / "done.db")
        os.replace(Path(tmp) / "done.db", path)  # whole, or not there
    return path


def _copy(source: Path, dest: Path) -> None:
    src = sqlite3.connect(source)
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()
    dest.chmod(0o600)


def seeded_store(dest: Path, n: int, seed_: int = 1) -> str:
    """A store at `dest` (a file that does not exist yet) holding the synthetic
    fleet of `n` hosts; its URL."""
    _copy(template(n, seed_), dest)
    return f"sqlite:///{dest}"
