"""Every operation's request is read from its plain form the same way
(hvfleet.ops.parsing.Query): an absent (None) entry takes its default, a bad
one is InvalidInput naming its field, and fit and claim ask for space alike."""

from __future__ import annotations

import pytest

from hvfleet.model.errors import InvalidInput
from hvfleet.ops.claims import ClaimQuery
from hvfleet.ops.fit import FitQuery
from hvfleet.ops.guests import CpuBaselineQuery, GuestQuery
from hvfleet.ops.parsing import Query
from hvfleet.ops.placement import PlacementQuery
from hvfleet.ops.tokens import TokenQuery


@pytest.mark.parametrize(("model", "given", "field", "default"), [
    (FitQuery, {"cpu": "2", "count": None}, "count", 1),
    (ClaimQuery, {"host": "hv1", "ttl": None}, "ttl", "10m"),
    (TokenQuery, {"role": "viewer", "ttl": None}, "ttl", "30d"),
    (PlacementQuery, {"labelSelector": None}, "label_selector", ""),
    (CpuBaselineQuery, {"expand": None}, "expand", False),
    (GuestQuery, {"os": "debian12", "name": "g", "vcpus": 1, "memory": "1Gi", "policy": None},
     "policy", GuestQuery.model_fields["policy"].default),
])
def test_an_absent_entry_takes_its_default(model: type[Query], given: dict[str, object], field: str,
                                           default: object) -> None:
    assert getattr(model.from_plain(given), field) == default


@pytest.mark.parametrize(("model", "given", "field"), [
    (FitQuery, {"count": "many"}, "count"),
    (ClaimQuery, {"auto": "perhaps"}, "auto"),
    (TokenQuery, {"role": "emperor"}, "role"),
    (PlacementQuery, {"labelSelector": ["a"]}, "labelSelector"),
    (FitQuery, {"colour": "red"}, "colour"),
])
def test_a_bad_entry_is_invalid_input_naming_its_field(model: type[Query], given: dict[str, object],
                                                       field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        model.from_plain(given)
    assert caught.value.field == field


def test_fit_and_claim_read_the_same_space() -> None:
    plain = {"cpu": "2", "memory": "4Gi", "resources": {"VGPU": "1"}, "count": 3}
    assert FitQuery.from_plain(plain).request() == ClaimQuery.from_plain(plain).request()
    with pytest.raises(InvalidInput) as caught:
        ClaimQuery.from_plain({"cpu": "2", "resources": {"cpu": "1"}}).request()
    assert caught.value.field == "resources"
