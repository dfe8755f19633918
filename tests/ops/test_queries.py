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


@pytest.mark.parametrize(("given", "field", "message"), [
    ({"resources": {"cpu": True}}, "resources.cpu", "expected a quantity, got a boolean"),
    ({"cpu": True}, "cpu", "expected a quantity, got a boolean"),
    ({"memory": False}, "memory", "expected a quantity, got a boolean"),
    ({"cpu": "1", "count": True}, "count", "valid integer"),
    ({"cpu": "1", "count": "3"}, "count", "valid integer"),
    ({"cpu": "1", "count": 3.0}, "count", "valid integer"),
    ({"cpu": "1", "limit": True}, "limit", "valid integer"),
    ({"cpu": "1", "limit": "2"}, "limit", "valid integer"),
    ({"cpu": "1", "why": "yes"}, "why", "valid boolean"),
    ({"cpu": "1", "why": 1}, "why", "valid boolean"),
])
def test_a_boolean_or_a_string_is_not_taken_for_a_number_or_a_flag(
        given: dict[str, object], field: str, message: str) -> None:
    # As stored objects refuse a boolean quantity: `true` is not 1, nor "yes" true.
    for model in (FitQuery, ClaimQuery):
        if model is ClaimQuery and field in ("limit", "why"):
            continue
        with pytest.raises(InvalidInput, match=message) as caught:
            model.from_plain(given)
        assert caught.value.field == field
    with pytest.raises(InvalidInput, match="valid boolean") as caught:
        ClaimQuery.from_plain({"cpu": "1", "auto": "true"})
    assert caught.value.field == "auto"


def test_a_quantity_may_be_a_json_number() -> None:
    query = FitQuery.from_plain({"cpu": 2, "memory": 1e9, "resources": {"VGPU": 1, "disk": 1.5}})
    assert FitQuery.from_plain({"cpu": "2", "memory": "1e9",
                                "resources": {"VGPU": "1", "disk": "1.5"}}).request() == query.request()
    with pytest.raises(InvalidInput) as caught:
        FitQuery.from_plain({"cpu": float("nan")})
    assert caught.value.field == "cpu"


def test_fit_and_claim_read_the_same_space() -> None:
    plain = {"cpu": "2", "memory": "4Gi", "resources": {"VGPU": "1"}, "count": 3}
    assert FitQuery.from_plain(plain).request() == ClaimQuery.from_plain(plain).request()
    with pytest.raises(InvalidInput) as caught:
        ClaimQuery.from_plain({"cpu": "2", "resources": {"cpu": "1"}}).request()
    assert caught.value.field == "resources"
