"""The long-running agent against real QEMU (qemu:///embed, TCG): lifecycle
events move allocation, a spec change moves effectiveCapacity, both within
the 2 s the issue allows, with a real SQLite store in between. Each scenario
runs in its own Python process (see embed_scenarios.py for why)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


@pytest.fixture(scope="session")
def embed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by the scenarios one after another, so QEMU's capabilities are
    probed once (a few seconds) and cached in the root."""
    return tmp_path_factory.mktemp("agent-embed")


def run_scenario(name: str, root: Path, db: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.agent.embed_scenarios", name, str(root), str(db)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    assert f"scenario {name}: ok" in out.stdout


def test_qemu_events_move_allocation_and_spec_moves_effective_capacity_within_2s(
    embed_root: Path, tmp_path: Path
) -> None:
    run_scenario("events_and_spec", embed_root, tmp_path / "hv.db")


def test_a_burst_of_qemu_events_is_debounced_into_few_writes(
    embed_root: Path, tmp_path: Path
) -> None:
    run_scenario("burst", embed_root, tmp_path / "hv.db")


def test_a_real_guest_panic_is_recorded_on_the_instance_with_a_metric_and_a_dump(
    embed_root: Path, tmp_path: Path
) -> None:
    # A policy-2026.2 guest whose boot sector writes to its pvpanic port: a real
    # guest crash on QEMU, reported by libvirt as lifecycle CRASHED.
    run_scenario("guest_crash", embed_root, tmp_path / "hv.db")


def test_a_placement_claim_is_counted_once_when_its_instance_shows_in_libvirt(
    embed_root: Path, tmp_path: Path
) -> None:
    run_scenario("placement_claim", embed_root, tmp_path / "hv.db")


@pytest.mark.parametrize("count", ["running", "defined"])
def test_a_claim_for_a_shut_off_guest_holds_what_libvirts_allocation_leaves_out(
    embed_root: Path, tmp_path: Path, count: str
) -> None:
    # --count running leaves the shut-off guest out of the allocation: its
    # claim holds all it asks. --count defined counts it: the claim holds the rest.
    run_scenario(f"shutoff_claim_{count}", embed_root, tmp_path / "hv.db")
