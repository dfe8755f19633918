"""One form for every quantity (issue 19): exact canonical binary quantities in
documents, the human form in tables, pages and log lines."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.cli.agent import summary
from hvfleet.model import Condition, Hypervisor, Quantity
from hvfleet.model.resources import CPU, DISK, HUGEPAGES_2MI, MEMORY, ResourceName
from hvfleet.ops.quantities import exact, readable
from hvfleet.scheduling.fit import Rejection

BYTES = st.sampled_from([MEMORY, DISK, HUGEPAGES_2MI])
SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


@given(r=BYTES, n=st.integers(0, 2**62), fmt=st.sampled_from(["binary", "decimal"]))
@settings(deadline=None)
def test_exact_bytes_parse_back_and_use_the_largest_exact_binary_suffix(r: ResourceName, n: int,
                                                                        fmt: str) -> None:
    text = exact(r, Quantity(n, fmt))  # type: ignore[arg-type]
    assert Quantity.parse(text).value == n
    if n == 0 or n % 1024:
        assert text == str(n)  # no suffix is exact: the plain number of bytes
    else:
        number, suffix = text[:-2], text[-2:]
        assert int(number) * SUFFIXES[suffix] == n
        bigger = [m for m in SUFFIXES.values() if m > SUFFIXES[suffix]]
        assert not bigger or n % min(bigger) != 0


def test_the_issues_examples() -> None:
    assert exact(MEMORY, 74732430950) == "74732430950"
    assert exact(MEMORY, Quantity(8742684 * 1024)) == "8742684Ki"
    assert exact(MEMORY, Quantity.parse("8192Mi")) == "8Gi"
    assert exact(MEMORY, Quantity.parse("8589934592")) == "8Gi"  # written in decimal
    assert readable(MEMORY, 74732430950) == "69.6Gi"
    assert readable(MEMORY, 8742684 * 1024) == "8.3Gi"
    assert readable(CPU, 738278) == "738,278"
    assert readable(CPU, 4096) == "4096"  # four digits read at a glance
    assert readable(CPU, Fraction(3, 2)) == "1500m"
    assert readable(MEMORY, None) == "-"


@given(n=st.integers(10_000, 10**15))
@settings(deadline=None)
def test_large_counts_have_thousands_separators(n: int) -> None:
    text = readable(CPU, n)
    assert text.replace(",", "") == str(n)
    assert all(len(group) == 3 for group in text.split(",")[1:])


def test_a_rejection_says_it_in_binary_units_and_keeps_exact_fields() -> None:
    from hvfleet.scheduling.fit import resource_rejections
    from hvfleet.scheduling.request import Request

    h = Hypervisor.model_validate({"metadata": {"name": "hv"}})
    h = h.model_copy(update={"status": h.status.model_copy(update={
        "capacity": {MEMORY: Quantity(66142496358), CPU: Quantity(8)}})})
    found = resource_rejections(h, [], Request({MEMORY: Quantity(68719476736)}), None)
    insufficient = next(r for r in found if r.reason == "insufficient")
    assert insufficient.message == "memory: needs 64Gi, 61.6Gi free (short by 2.4Gi)"
    doc = Rejection.to_dict(insufficient)
    # Free memory in whole MiB (Placement's MEMORY_MB): ⌊66142496358 B⌋ = 63078 MiB.
    assert doc["requested"] == "64Gi" and doc["available"] == "63078Mi"
    assert doc["shortBy"] == "2458Mi"  # 65536 − 63078 MiB


def test_the_agents_summary_line_is_in_the_human_form() -> None:
    h = Hypervisor.model_validate({"metadata": {"name": "hv1"}})
    h = h.model_copy(update={"status": h.status.model_copy(update={
        "capacity": {CPU: Quantity(12), MEMORY: Quantity(16 * 2**30, "binary")},
        "allocation": {CPU: Quantity(4), MEMORY: Quantity(8742684 * 1024, "binary")},
        "conditions": [Condition(type="Ready", status="True")],
        "last_heartbeat_time": datetime.now(UTC)})})
    line = summary(h, "sqlite:///x.db")
    assert line.startswith("hv1: cpu 4/12, memory 8.3Gi/16Gi, 0 instance(s)"), line
