"""Splitting a whole amount into parts by weight, in whole units.

Per-cell figures must add back up to the host figure exactly, or a scheduler
that checks cells and host will disagree with itself. Splitting 1 vCPU over 3
cells as thirds would also produce quantities with no finite decimal form. So
amounts are split in whole units (1 byte, 1 millicpu, 1 page) with the
largest-remainder method; ties go to the lower key, so the result is
deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction


def split(total: int, weights: Mapping[int, int | Fraction]) -> dict[int, int]:
    """`total` units over the keys of `weights`, proportionally, summing to `total`."""
    live = {k: Fraction(w) for k, w in weights.items() if w > 0}
    if total < 0:
        raise ValueError(f"cannot split a negative amount ({total})")
    if not live:
        raise ValueError("cannot split over no positive weights")
    weight_sum = sum(live.values())
    exact = {k: total * w / weight_sum for k, w in live.items()}
    out = {k: int(v) for k, v in exact.items()}  # floor: all values are >= 0
    left = total - sum(out.values())
    by_remainder = sorted(live, key=lambda k: (-(exact[k] - out[k]), k))
    for k in by_remainder[:left]:
        out[k] += 1
    return out


def split_evenly(total: int, keys: list[int] | frozenset[int] | set[int]) -> dict[int, int]:
    return split(total, dict.fromkeys(sorted(keys), 1))
