"""The on-disk cache of parsed cpu_map and osinfo-db: same data as parsing,
rebuilt when a source (or the parsing code) changes or the entry is corrupt,
safe under concurrent processes, and harmless when it cannot be written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvfleet.guests import cpumap, datacache, osinfo

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("HVFLEET_CACHE_DIR", str(d))
    cpumap.load_cpu_map.cache_clear()
    osinfo.load_os_database.cache_clear()
    yield d
    cpumap.load_cpu_map.cache_clear()
    osinfo.load_os_database.cache_clear()


def _entries(d: Path) -> list[Path]:
    return sorted(d.glob("*.json"))


def test_the_cache_holds_exactly_what_parsing_gives(cache: Path) -> None:
    first = cpumap.load_cpu_map()  # parses and writes
    assert [p.name.split("-")[0] for p in _entries(cache)] == ["cpu_map"]
    cpumap.load_cpu_map.cache_clear()
    again = cpumap.load_cpu_map()  # reads the entry
    assert again == first == cpumap._load(cpumap.CPU_MAP_DIR)
    assert again.models["Icelake-Server"].removed == frozenset({"intel-pt"})

    db = osinfo.OSDatabase()
    fresh = osinfo._parse_tables(osinfo.OSINFO_DIR)
    assert (db._raw, db._by_short) == fresh
    db2 = osinfo.OSDatabase()  # from the entry
    assert (db2._raw, db2._by_short) == fresh
    assert db2.get("win11") == db.get("win11")
    assert len(_entries(cache)) == 2


def test_a_corrupt_or_foreign_entry_is_ignored_and_rebuilt(cache: Path) -> None:
    want = cpumap.load_cpu_map()
    (entry,) = _entries(cache)
    for junk in (b"", b"{not json", b"[]", json.dumps({"key": "x", "data": 1}).encode(),
                 json.dumps({"key": json.loads(entry.read_bytes())["key"], "data": {}}).encode()):
        entry.write_bytes(junk)
        cpumap.load_cpu_map.cache_clear()
        assert cpumap.load_cpu_map() == want
        assert json.loads(entry.read_bytes())["data"]["models"]  # rewritten whole


def test_a_changed_source_file_is_seen(cache: Path, tmp_path: Path) -> None:
    src = tmp_path / "cpu_map"
    shutil.copytree(cpumap.CPU_MAP_DIR, src)
    before = cpumap.load_cpu_map(str(src))
    assert "avx512vnni" in before.models["Cascadelake-Server"].features
    model = src / "x86_Cascadelake-Server.xml"
    text = model.read_text()
    model.write_text(text.replace("<feature name='avx512vnni'/>", ""))
    os.utime(model, ns=(1, 1))  # whatever the clock: a different version
    cpumap.load_cpu_map.cache_clear()
    after = cpumap.load_cpu_map(str(src))
    assert "avx512vnni" not in after.models["Cascadelake-Server"].features
    # The system's own cpu_map has its own entry, untouched.
    cpumap.load_cpu_map.cache_clear()
    assert "avx512vnni" in cpumap.load_cpu_map().models["Cascadelake-Server"].features


def test_changed_parsing_code_rebuilds(cache: Path, tmp_path: Path) -> None:
    code = tmp_path / "parser.py"
    code.write_text("v1")
    src = tmp_path / "data.xml"
    src.write_text("<x/>")
    calls: list[int] = []

    def build() -> int:
        calls.append(1)
        return len(calls)

    def get() -> int:
        return datacache.cached("t", str(tmp_path), [str(src)], [str(code)], build,
                                lambda v: v, lambda d: int(d))

    assert get() == 1 and get() == 1
    code.write_text("v2, a longer parser")
    assert get() == 2 and get() == 2
    src.unlink()  # a source that went away is a change too
    assert get() == 3


def test_an_unwritable_cache_only_costs_speed(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("HVFLEET_CACHE_DIR", str(blocker / "hvfleet"))
    cpumap.load_cpu_map.cache_clear()
    try:
        assert "Icelake-Server" in cpumap.load_cpu_map().models
    finally:
        cpumap.load_cpu_map.cache_clear()


def test_cache_dir_follows_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HVFLEET_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert datacache.cache_dir() == str(tmp_path / "xdg" / "hvfleet")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert datacache.cache_dir() == str(tmp_path / "home" / ".cache" / "hvfleet")
    monkeypatch.setenv("HVFLEET_CACHE_DIR", str(tmp_path / "mine"))
    assert datacache.cache_dir() == str(tmp_path / "mine")


def test_concurrent_processes_build_and_read_safely(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "HVFLEET_CACHE_DIR": str(cache),
           "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = (
        "import hashlib, json, dataclasses;"
        "from hvfleet.guests.cpumap import load_cpu_map;"
        "from hvfleet.guests.osinfo import os_info;"
        "m = load_cpu_map(); o = os_info('win11');"
        "print(hashlib.sha256(json.dumps([sorted(m.models), sorted(m.models['EPYC'].features),"
        " dataclasses.asdict(o)], sort_keys=True, default=sorted).encode()).hexdigest())"
    )
    for _round in range(2):  # all build at once, then all read at once
        procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                  text=True) for _ in range(6)]
        outs = {p.communicate(timeout=120)[0] for p in procs}
        assert all(p.returncode == 0 for p in procs)
        assert len(outs) == 1
    assert [p.name.split("-")[0] for p in _entries(cache)] == ["cpu_map", "osinfo"]
    assert not list(cache.glob(".tmp-*"))  # every temporary file was renamed or removed


def test_two_checkouts_sharing_a_cache_keep_one_entry_each(cache: Path, tmp_path: Path) -> None:
    src = tmp_path / "data.xml"
    src.write_text("<x/>")
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("parser a")
    b.write_text("parser b")
    built: list[str] = []

    def get(code: Path) -> str:
        def build() -> str:
            built.append(code.name)
            return code.name
        return datacache.cached("t", str(tmp_path), [str(src)], [str(code)], build,
                                lambda v: v, lambda d: str(d))

    assert [get(a), get(b), get(a), get(b)] == ["a.py", "b.py", "a.py", "b.py"]
    assert built == ["a.py", "b.py"]  # each built once, not on every switch


def test_entries_unused_for_long_are_pruned_when_one_is_written(cache: Path,
                                                                tmp_path: Path) -> None:
    cpumap.load_cpu_map()
    (live,) = _entries(cache)
    stale = cache / "cpu_map-0000000000000000.json"
    recent = cache / "cpu_map-1111111111111111.json"
    other = cache / "osinfo-2222222222222222.json"
    for p in (stale, recent, other):
        p.write_text("{}")
    old = 1_000_000.0  # 1970: long unused
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    os.utime(live, (old, old))
    cpumap.load_cpu_map.cache_clear()
    cpumap.load_cpu_map()  # a hit: the entry in use is kept fresh
    assert live.stat().st_mtime > old
    src = tmp_path / "cpu_map"
    shutil.copytree(cpumap.CPU_MAP_DIR, src)
    cpumap.load_cpu_map(str(src))  # a miss: writes, and prunes its kind
    assert live.exists() and recent.exists() and other.exists()
    assert not stale.exists()


def test_a_process_that_keeps_what_it_loaded_learns_of_a_change(cache: Path, tmp_path: Path) -> None:
    """revalidate(): what the API server or a CLI worker calls before serving
    from memory. An edit, a new file and a removed one are each seen; nothing
    changed, nothing is cleared."""
    src = tmp_path / "cpu_map"
    shutil.copytree(cpumap.CPU_MAP_DIR, src)
    first = cpumap.load_cpu_map(str(src))
    assert datacache.revalidate() == []
    assert cpumap.load_cpu_map(str(src)) is first  # still the memo
    model = src / "x86_Cascadelake-Server.xml"
    model.write_text(model.read_text().replace("<feature name='avx512vnni'/>", ""))
    os.utime(model, ns=(1, 1))
    assert datacache.revalidate() != []
    edited = cpumap.load_cpu_map(str(src))
    assert edited is not first
    assert "avx512vnni" not in edited.models["Cascadelake-Server"].features
    assert datacache.revalidate() == []
    (src / "x86_Made-Up.xml").write_text("<cpus/>")  # a new file: its directory changed
    assert datacache.revalidate() != []
    cpumap.load_cpu_map(str(src))
    (src / "x86_Made-Up.xml").unlink()
    assert datacache.revalidate() != []
    # The data versions recorded in guests are hashed again too.
    from hvfleet.guests import datasets

    v = datasets.cpu_map_version(str(src))
    cpumap.load_cpu_map(str(src))
    model.write_text(model.read_text() + "\n")
    assert datacache.revalidate() != []
    assert datasets.cpu_map_version(str(src)) != v


def test_revalidate_every_compares_at_most_that_often(cache: Path, tmp_path: Path) -> None:
    src = tmp_path / "cpu_map"
    shutil.copytree(cpumap.CPU_MAP_DIR, src)
    first = cpumap.load_cpu_map(str(src))
    assert datacache.revalidate() == []  # compared just now
    model = src / "x86_Cascadelake-Server.xml"
    model.write_text(model.read_text() + "\n")
    assert datacache.revalidate(every=3600) == []  # too soon: not compared
    assert cpumap.load_cpu_map(str(src)) is first
    assert datacache.revalidate() != []
    assert cpumap.load_cpu_map(str(src)) is not first
