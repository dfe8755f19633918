"""Fixtures for the guest generator tests: real libvirt connections.

`embed_conn` is QEMU in-process (`qemu:///embed?root=TMP`, TCG, no daemon) with
its own qemu.conf under TMP, so the machine's libvirt setup is never touched.
`test_conn` is libvirt's test driver, the reference for CPU baselines.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

REPO = Path(__file__).resolve().parents[2]

# The generator's data cache (osinfo-db, cpu_map) goes to a directory of this
# test session, not the user's ~/.cache/hvfleet: tests make data directories
# of their own, and subprocesses share it through the environment.
_CACHE = tempfile.mkdtemp(prefix="hvfleet-test-cache-")
os.environ["HVFLEET_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)
HOSTS = REPO / "examples" / "hosts"

QEMU_CONF = """stdio_handler = "file"
user = "root"
group = "root"
security_driver = "none"
cgroup_controllers = [ ]
swtpm_user = "root"
swtpm_group = "root"
"""
# swtpm runs as "tss" by default, which cannot enter pytest's 0700 temp dirs.

_event_loop_registered = False


def _register_event_loop() -> None:
    global _event_loop_registered
    if not _event_loop_registered:
        libvirt.virEventRegisterDefaultImpl()
        _event_loop_registered = True


def _quiet(_ctx: object, _err: object) -> None:
    # libvirt prints every error to stderr by default; tests assert on exceptions.
    return None


@pytest.fixture(scope="session")
def embed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("embed")
    (root / "etc").mkdir()
    (root / "etc" / "qemu.conf").write_text(QEMU_CONF)
    return root


@pytest.fixture(scope="session")
def embed_conn(embed_root: Path) -> Iterator[libvirt.virConnect]:
    _register_event_loop()
    libvirt.registerErrorHandler(_quiet, None)
    conn = libvirt.open(f"qemu:///embed?root={embed_root}")
    try:
        yield conn
    finally:
        for dom in conn.listAllDomains():
            if dom.isActive():
                dom.destroy()
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        conn.close()


@pytest.fixture(scope="session")
def test_conn() -> Iterator[libvirt.virConnect]:
    libvirt.registerErrorHandler(_quiet, None)
    conn = libvirt.open("test:///default")
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o755)
    return tmp_path
