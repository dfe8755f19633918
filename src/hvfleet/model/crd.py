"""CustomResourceDefinitions generated from the models.

Kubernetes wants *structural* schemas: no `$ref`, a `type` on every node (or
`x-kubernetes-int-or-string` / `x-kubernetes-preserve-unknown-fields`), maps as
`additionalProperties`, `nullable` instead of `anyOf [T, null]`. This turns
pydantic's JSON Schema into that shape, so `hvfleet crd | kubectl apply -f -`
creates the same resources hvfleet stores.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from hvfleet.model.field_docs import FIELD_DOCS, describe
from hvfleet.model.kinds import STRATEGIES
from hvfleet.model.meta import API_GROUP

# Not in Kubernetes' JSONSchemaProps: `propertyNames` (the bound on map keys,
# from the models' str_max_length) is checked by the model on write instead.
_DROP = {"title", "default", "description_", "discriminator", "propertyNames"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**copy.deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if node.get("x-kubernetes-int-or-string"):
        # The shape controller-gen emits for resource.Quantity.
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": node["pattern"],
            "x-kubernetes-int-or-string": True,
        }
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) != len(node["anyOf"])
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            single: dict[str, Any] = _structural({**options[0], **rest}, defs)
            if nullable:
                single["nullable"] = True
            return single
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "format" and value == "date-time":
            out[key] = value
            continue
        out[key] = _structural(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def plain_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's structural schema as it is (no CRD rules on metadata)."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    out: dict[str, Any] = _structural(schema, schema.get("$defs", {}))
    return out


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    defs = schema.get("$defs", {})
    out: dict[str, Any] = _structural(schema, defs)
    props = out.get("properties", {})
    # The API server owns metadata's schema; a CRD declares it as a plain object.
    props["metadata"] = {"type": "object"}
    out["required"] = [r for r in out.get("required", []) if r != "metadata"] or None
    if out["required"] is None:
        del out["required"]
    return out


# Every kind's last column, as kube-apiserver's default table ends.
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _version(model: type[BaseModel], kind: str, columns: list[dict[str, Any]]) -> dict[str, Any]:
    # A Lease has no status (as coordination.k8s.io's), so no status subresource.
    has_status = "status" in model.model_fields
    # Every field described, for `kubectl explain` (here and on a cluster with the CRDs).
    schema = describe(structural_schema(model), FIELD_DOCS[kind])
    return {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "subresources": {"status": {}} if has_status else {},
        "additionalPrinterColumns": [*columns, _AGE],
    }


def crds() -> list[dict[str, Any]]:
    hv_columns: list[dict[str, Any]] = [
        {"name": "Ready", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "CPU", "type": "string", "jsonPath": ".status.effectiveCapacity.cpu"},
        {"name": "Memory", "type": "string", "jsonPath": ".status.effectiveCapacity.memory"},
        {"name": "Maintenance", "type": "string", "jsonPath": ".spec.maintenance"},
        # effectiveCapacity above is the agent's copy; it lags while Generation > Observed.
        {"name": "Generation", "type": "integer", "jsonPath": ".metadata.generation", "priority": 1},
        {"name": "Observed", "type": "integer", "jsonPath": ".status.observedGeneration", "priority": 1},
    ]
    res_columns = [
        {"name": "Hypervisor", "type": "string", "jsonPath": ".spec.hypervisor"},
        {"name": "Consumer", "type": "string", "jsonPath": ".spec.consumer"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    ]
    policy_columns = [
        {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
    ]
    lease_columns = [
        {"name": "Holder", "type": "string", "jsonPath": ".spec.holderIdentity"},
        {"name": "Renewed", "type": "date", "jsonPath": ".spec.renewTime"},
        {"name": "Duration", "type": "integer", "jsonPath": ".spec.leaseDurationSeconds"},
    ]
    out = []
    columns_of = {"Hypervisor": hv_columns, "Reservation": res_columns, "Lease": lease_columns,
                  "OvercommitPolicy": policy_columns}
    for kind, columns in columns_of.items():
        names = STRATEGIES[kind]
        model, plural, short = names.model, names.plural, list(names.short_names)
        out.append({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{API_GROUP}"},
            "spec": {
                "group": API_GROUP,
                "scope": "Cluster",
                "names": {
                    "kind": kind, "listKind": f"{kind}List", "plural": plural,
                    "singular": kind.lower(), **({"shortNames": short} if short else {}),
                },
                "versions": [_version(model, kind, columns)],
            },
        })
    return out
