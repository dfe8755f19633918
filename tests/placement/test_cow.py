"""hvfleet.placement.cow: every view a CowDict hands out keeps the contents
it had when handed out, whatever changes follow (overlay copies and
compactions included), and equals a plain dict patched the same way."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.placement import cow

# (op, key, value): set, pop, or hand out a view
ops = st.lists(st.tuples(st.sampled_from(["set", "pop", "view"]), st.integers(0, 12), st.integers()),
               max_size=120)


@settings(max_examples=100, deadline=None)
@given(ops=ops, compact_at=st.integers(0, 6))
def test_views_keep_what_they_had_and_match_a_dict(ops: list[tuple[str, int, int]], compact_at: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cow, "COMPACT_AT", compact_at)
        d: cow.CowDict[int, int] = cow.CowDict()
        model: dict[int, int] = {}
        handed: list[tuple[cow.Layered[int, int], dict[int, int]]] = []
        for op, key, value in ops:
            if op == "set":
                d[key] = value
                model[key] = value
            elif op == "pop":
                assert d.pop(key) == model.pop(key, None)
            else:
                handed.append((d.view(), dict(model)))
            assert len(d) == len(model)
            assert d.get(key) == model.get(key) and (key in d) == (key in model)
        handed.append((d.view(), dict(model)))
        for view, then in handed:
            assert dict(view) == then and len(view) == len(then)
            assert sorted(view) == sorted(then)
            for k in range(13):
                assert (k in view) == (k in then) and view.get(k) == then.get(k)
