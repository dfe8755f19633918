"""The published OpenAPI explains every field: each kind's metadata is the
ObjectMeta schema, and every field has a description, so `kubectl explain`
(1.20 over /openapi/v2 protobuf, current over /openapi/v3) explains it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hvfleet.model.field_docs import fields
from hvfleet.server.discovery import RESOURCES
from hvfleet.server.openapi import OBJECT_META, openapi_v2, openapi_v3_group
from tests.server.clients import Kubectl
from tests.server.conftest import Api
from tests.support.kubectl import KUBECTLS


def test_every_field_of_every_kind_and_of_object_meta_has_a_description() -> None:
    schemas = openapi_v3_group()["components"]["schemas"]
    for r in RESOURCES.values():
        schema = schemas[f"io.hvfleet.v1.{r.kind}"]
        missing = [p for p, node in fields(schema) if not node.get("description")]
        assert missing == [], (r.kind, missing)
        assert schema["properties"]["metadata"]["allOf"] == [
            {"$ref": f"#/components/schemas/{OBJECT_META}"}]
        v2 = openapi_v2()["definitions"][f"io.hvfleet.v1.{r.kind}"]
        assert v2["properties"]["metadata"]["$ref"] == f"#/definitions/{OBJECT_META}"
    meta = schemas[OBJECT_META]
    missing = [p for p, node in fields(meta) if not node.get("description")]
    assert missing == []
    assert {"name", "generateName", "finalizers", "ownerReferences", "deletionTimestamp"} <= set(
        meta["properties"])


@pytest.mark.parametrize("version", sorted(KUBECTLS))
def test_kubectl_explain_explains_a_field_and_metadata(make_api: Callable[..., Api], tmp_path: Path,
                                                       version: str) -> None:
    kubectl = Kubectl(KUBECTLS[version], version, make_api(tls=True), tmp_path)
    r = kubectl("explain", "hypervisor.spec.overcommit")
    assert r.returncode == 0, r.stderr
    assert "Overcommit ratio per resource" in " ".join(r.stdout.split())
    r = kubectl("explain", "hypervisor.metadata.finalizers")
    assert r.returncode == 0, r.stderr
    assert "must each be removed before a deleted object goes away" in " ".join(r.stdout.split())
    r = kubectl("explain", "reservations.spec")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "Name of the Hypervisor the space is claimed on" in text
