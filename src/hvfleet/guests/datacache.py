"""An on-disk cache of what the generator parses from read-only system data
(libvirt's cpu_map, osinfo-db), so a one-shot `hvfleet guest generate` does not
parse hundreds of XML files on every run.

An entry is a JSON file in the cache directory (`$HVFLEET_CACHE_DIR`, else
`$XDG_CACHE_HOME/hvfleet`, else `~/.cache/hvfleet`), keyed by the versions of
everything its content depends on: each source file's path, size and
modification time, hvfleet's version, and the same for the modules whose code
turns the sources into the entry (so an edited parser never reads what an older
one wrote). An entry whose key differs, or that cannot be read or decoded, is
ignored and rebuilt. Entries are written to a temporary file and renamed into
place, so concurrent processes see either a whole old entry or a whole new one.
A cache directory that cannot be written only costs the speed. Entries
unused for 30 days are removed when another of their kind is written.

A process that keeps what it loaded (the API server, a CLI worker) calls
`revalidate()` to learn whether the files behind it changed since; the
in-process memos registered with `forget=` or `on_change` are then cleared, so
the next call loads the new files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

# Bump when the layout of any entry changes.
FORMAT = 1


def cache_dir() -> str:
    explicit = os.environ.get("HVFLEET_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hvfleet")


def tree_files(root: str, suffix: str = ".xml") -> list[str]:
    """Every file under `root` ending in `suffix`, sorted (one directory walk)."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        out += [os.path.join(dirpath, f) for f in filenames if f.endswith(suffix)]
    out.sort()
    return out


def file_versions(paths: Iterable[str]) -> list[tuple[str, int, int]]:
    """(path, mtime_ns, size) of each path; (path, -1, -1) for one that is gone."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out.append((p, -1, -1))
        else:
            out.append((p, st.st_mtime_ns, st.st_size))
    return out


def fingerprint(sources: Iterable[str], code: Iterable[str]) -> str:
    import hvfleet

    doc = [FORMAT, hvfleet.__version__, file_versions(sources), file_versions(code)]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def entry_path(kind: str, root: str, code: Iterable[str] = ()) -> str:
    """One entry per data directory and per install of the parsing code: two
    checkouts sharing a cache directory (a developer's worktrees, CI next to
    an installed copy) would otherwise overwrite each other's entry on every
    run, while an edited parser still replaces its own."""
    where = [os.path.abspath(root), *(os.path.abspath(c) for c in code)]
    tag = hashlib.sha256("\0".join(where).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"{kind}-{tag}.json")


# What this process has loaded: entry path → (the files and directories its
# key covers, their versions then); and what to clear when one of them changed.
_LOADED: dict[str, tuple[list[str], list[tuple[str, int, int]]]] = {}
_FORGET: list[Callable[[], None]] = []


def on_change(forget: Callable[[], None]) -> None:
    """Call `forget` (an in-process memo's cache_clear) when `revalidate()`
    finds a loaded entry's files changed."""
    if forget not in _FORGET:
        _FORGET.append(forget)


def watched() -> list[str]:
    """The files and directories the loaded entries' keys cover."""
    return sorted({p for paths, _ in _LOADED.values() for p in paths})


_CHECKED = [0.0]  # when revalidate last compared (time.monotonic())
_LOCK = threading.Lock()  # the API server's threads revalidate and load at once


def revalidate(every: float = 0.0) -> list[str]:
    """The loaded entries whose files changed (edited, added or removed: their
    directories are watched too) since this process loaded them. When any did,
    every registered memo is cleared and the list of loaded entries emptied.
    With `every`, compare at most that often (seconds); [] between times."""
    with _LOCK:
        now = time.monotonic()
        if every and now - _CHECKED[0] < every:
            return []
        _CHECKED[0] = now
        stale = [path for path, (watched, then) in list(_LOADED.items())
                 if file_versions(watched) != then]
        if stale:
            for forget in _FORGET:
                forget()
            _LOADED.clear()
    return stale


def cached(
    kind: str,
    root: str,
    sources: Iterable[str],
    code: Iterable[str],
    build: Callable[[], T],
    dump: Callable[[T], Any],
    load: Callable[[Any], T],
    forget: Callable[[], None] | None = None,
) -> T:
    """`load` of the cached entry for (`kind`, `root`) when its key still holds,
    else `build()`, stored through `dump` for the next process. `forget` clears
    the caller's in-process memo of the result (see `revalidate`)."""
    code = list(code)
    sources = list(sources)
    key = fingerprint(sources, code)
    watched = sorted({*sources, *code, *(os.path.dirname(p) for p in sources), root})
    path = entry_path(kind, root, code)
    _LOADED[path] = (watched, file_versions(watched))
    if forget is not None:
        on_change(forget)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        if isinstance(doc, dict) and doc.get("key") == key:
            value = load(doc["data"])
            if os.stat(path).st_mtime < time.time() - PRUNE_AFTER_S / 2:
                os.utime(path)  # still in use: not to be pruned
            return value
    except Exception:  # unreadable, corrupt or foreign: rebuilt below
        pass
    value = build()
    _write(path, {"key": key, "data": dump(value)})
    _prune(kind, keep=path)
    return value


# Entries of data directories or checkouts that are gone (a test's copy, an
# old worktree) are never read again: when an entry is written (rarely, on a
# change), those of its kind untouched for this long are removed.
PRUNE_AFTER_S = 30 * 24 * 3600


def _prune(kind: str, keep: str) -> None:
    limit = time.time() - PRUNE_AFTER_S
    try:
        entries = os.scandir(cache_dir())
    except OSError:
        return
    with entries:
        for e in entries:
            if e.name.startswith(f"{kind}-") and e.path != keep:
                with contextlib.suppress(OSError):
                    if e.stat().st_mtime < limit:
                        os.unlink(e.path)


def _write(path: str, doc: dict[str, Any]) -> None:
    import tempfile  # only when an entry is (re)written

    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
