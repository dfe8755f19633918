"""The Placement API's handlers: parse and validate (hvfleet.placement.schemas),
call the core (hvfleet.placement.service, .allocations), render per
microversion. Nothing here decides a rule of Placement's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hvfleet.placement import allocations as alloc
from hvfleet.placement import candidates, query, records, schemas, service
from hvfleet.placement.errors import PlacementBadRequest, PlacementNotFound
from hvfleet.placement.records import ProviderView
from hvfleet.placement.standard_names import RESOURCE_CLASSES, TRAITS
from hvfleet.server.placement.edge import Call, EncodedJSON
from hvfleet.server.placement.microversion import MAX_VERSION, MIN_VERSION, version_text


def _now() -> datetime:
    return datetime.now(UTC)


# -- root -------------------------------------------------------------------------------


def root(call: Call, _: Any) -> dict[str, Any]:
    call.last_modified = _now()
    return {"versions": [{
        "id": f"v{version_text(MIN_VERSION)}", "max_version": version_text(MAX_VERSION),
        "min_version": version_text(MIN_VERSION), "status": "CURRENT",
        "links": [{"rel": "self", "href": ""}],
    }]}


# -- providers --------------------------------------------------------------------------


def _links(call: Call, p: ProviderView) -> list[dict[str, str]]:
    base = f"{call.mount}/resource_providers/{p.uuid}"
    links = [{"rel": "self", "href": base}, {"rel": "inventories", "href": f"{base}/inventories"},
             {"rel": "usages", "href": f"{base}/usages"}]
    if call.at_least(1, 1):
        links.append({"rel": "aggregates", "href": f"{base}/aggregates"})
    if call.at_least(1, 6):
        links.append({"rel": "traits", "href": f"{base}/traits"})
    if call.at_least(1, 11):
        links.append({"rel": "allocations", "href": f"{base}/allocations"})
    return links


def provider_doc(call: Call, p: ProviderView) -> dict[str, Any]:
    out: dict[str, Any] = {"uuid": p.uuid, "name": p.name, "generation": p.generation,
                           "links": _links(call, p)}
    if call.at_least(1, 14):
        out["parent_provider_uuid"] = p.parent_uuid
        out["root_provider_uuid"] = p.root_uuid
    return out


def _stamp(p: ProviderView) -> datetime:
    return p.updated or p.created or _now()


def create_provider(call: Call, data: Any) -> Any:
    schemas.validate(data, schemas.POST_RP_1_14 if call.at_least(1, 14) else schemas.POST_RP)
    p = service.create_provider(call.source(), data["name"], data.get("uuid"),
                                data.get("parent_provider_uuid"))
    call.headers["location"] = f"{call.mount}/resource_providers/{p.uuid}"
    if call.at_least(1, 20):
        call.last_modified = _stamp(p)
        return provider_doc(call, p)
    call.status = 201
    return None


def get_provider(call: Call, _: Any) -> Any:
    p = call.source().fleet().provider(call.path("uuid"))
    call.last_modified = _stamp(p)
    return provider_doc(call, p)


def update_provider(call: Call, data: Any) -> Any:
    schemas.validate(data, schemas.PUT_RP_1_14 if call.at_least(1, 14) else schemas.PUT_RP)
    p = service.update_provider(call.source(), call.path("uuid"), data, call.at_least(1, 37))
    call.last_modified = _stamp(p)
    return provider_doc(call, p)


def delete_provider(call: Call, _: Any) -> None:
    service.delete_provider(call.source(), call.path("uuid"))
    call.status = 204


def list_providers(call: Call, _: Any) -> Any:
    schema = (schemas.GET_RPS_1_18 if call.at_least(1, 18) else schemas.GET_RPS_1_14 if call.at_least(1, 14)
              else schemas.GET_RPS_1_4 if call.at_least(1, 4) else schemas.GET_RPS_1_3
              if call.at_least(1, 3) else schemas.GET_RPS_1_0)
    schemas.validate_query({k: v[0] for k, v in call.params.items()}, schema)
    traits = query.parse_traits(call.params.get("required", []), call.version)
    member_of = query.parse_member_of(call.params.get("member_of", []), call.version)
    resources = query.parse_resources(call.params["resources"][0]) if "resources" in call.params else None
    found = service.list_providers(
        call.source(), name=call.one("name"), uuid=call.one("uuid"), in_tree=call.one("in_tree"),
        member_of=member_of, resources=resources, traits=traits)
    call.last_modified = records.latest([_stamp(p) for p in found], _now())
    return {"resource_providers": [provider_doc(call, p) for p in found]}


# -- inventories ------------------------------------------------------------------------


def _inv(i: Any) -> dict[str, Any]:
    return {"total": i.total, "reserved": i.reserved, "min_unit": i.min_unit, "max_unit": i.max_unit,
            "step_size": i.step_size, "allocation_ratio": i.allocation_ratio}


def _inventories_doc(call: Call, p: ProviderView) -> dict[str, Any]:
    call.last_modified = _stamp(p)
    return {"resource_provider_generation": p.generation,
            "inventories": {rc: _inv(i) for rc, i in sorted(p.inventories.items())}}


def _provider_or_404(call: Call) -> ProviderView:
    uuid = call.path("uuid")
    p = call.source().fleet().providers.get(uuid)
    if p is None:
        raise PlacementNotFound(
            f"No resource provider with uuid {uuid} found : No resource provider with uuid {uuid} found")
    return p


def get_inventories(call: Call, _: Any) -> Any:
    return _inventories_doc(call, _provider_or_404(call))


def get_inventory(call: Call, _: Any) -> Any:
    p = _provider_or_404(call)
    rc = call.path("rc")
    inv = p.inventories.get(rc)
    if inv is None:
        raise PlacementNotFound(f"No inventory of class {rc} for {p.uuid}")
    call.last_modified = _stamp(p)
    return {"resource_provider_generation": p.generation, **_inv(inv)}


def put_inventories(call: Call, data: Any) -> Any:
    schemas.validate(data, schemas.PUT_INVENTORY)
    p = service.set_inventories(call.source(), call.path("uuid"), data["resource_provider_generation"],
                                data["inventories"], call.at_least(1, 26))
    return _inventories_doc(call, p)


def post_inventory(call: Call, data: Any) -> Any:
    schemas.validate(data, schemas.POST_INVENTORY)
    rc = data["resource_class"]
    p = service.set_inventory(call.source(), call.path("uuid"), rc, data, call.at_least(1, 26), create=True)
    call.status = 201
    call.headers["location"] = f"{call.mount}/resource_providers/{p.uuid}/inventories/{rc}"
    call.last_modified = _stamp(p)
    return {"resource_provider_generation": p.generation, **_inv(p.inventories[rc])}


def put_inventory(call: Call, data: Any) -> Any:
    schemas.validate(data, schemas.BASE_INVENTORY)
    rc = call.path("rc")
    p = service.set_inventory(call.source(), call.path("uuid"), rc, data, call.at_least(1, 26), create=False)
    call.last_modified = _stamp(p)
    return {"resource_provider_generation": p.generation, **_inv(p.inventories[rc])}


def delete_inventory(call: Call, _: Any) -> None:
    service.delete_inventory(call.source(), call.path("uuid"), call.path("rc"))
    call.status = 204


def delete_inventories(call: Call, _: Any) -> None:
    service.delete_inventories(call.source(), call.path("uuid"))
    call.status = 204


# -- usages -----------------------------------------------------------------------------


def provider_usages(call: Call, _: Any) -> Any:
    p = service.provider_usages(call.source(), call.path("uuid"))
    call.last_modified = _now()
    usages = p.usages
    return {"resource_provider_generation": p.generation,
            "usages": {rc: usages.get(rc, 0) for rc in sorted(set(p.inventories) | set(usages))}}


def usages(call: Call, _: Any) -> Any:
    schema = schemas.GET_USAGES_1_38 if call.at_least(1, 38) else schemas.GET_USAGES_1_9
    schemas.validate_query({k: v[0] for k, v in call.params.items()}, schema)
    by_type = service.total_usages(call.source(), call.params["project_id"][0], call.one("user_id"),
                                   call.one("consumer_type"))
    call.last_modified = _now()
    if call.at_least(1, 38):
        out: dict[str, Any] = {}
        for ctype, (count, res) in by_type.items():
            out[ctype] = {"consumer_count": count, **res}
        return {"usages": out}
    total: dict[str, int] = {}
    for _, res in by_type.values():
        for rc, n in res.items():
            total[rc] = total.get(rc, 0) + n
    return {"usages": total}


# -- resource classes -------------------------------------------------------------------


def list_resource_classes(call: Call, _: Any) -> Any:
    classes = records.in_placement_order(call.source().known_names()[0])
    call.last_modified = _now()
    return {"resource_classes": [{"name": n, "links": [
        {"rel": "self", "href": f"{call.mount}/resource_classes/{n}"}]} for n in classes]}


def get_resource_class(call: Call, _: Any) -> Any:
    name = call.path("name")
    if name not in call.source().known_names()[0]:
        raise PlacementNotFound(f"No such resource class {name}.")
    call.last_modified = _now()
    return {"name": name, "links": [{"rel": "self", "href": f"{call.mount}/resource_classes/{name}"}]}


def create_resource_class(call: Call, data: Any) -> Any:
    schemas.validate(data, schemas.POST_RC)
    name = data["name"]
    # A class a hypervisor's inventories name exists without a record of its own.
    known = call.source().known_names()[0]
    if name in known or not service.create_custom(call.store, "resource-class", name):
        from hvfleet.placement.errors import PlacementConflict

        raise PlacementConflict(f"Conflicting resource class already exists: {name}")
    call.status = 201
    call.headers["location"] = f"{call.mount}/resource_classes/{name}"
    return None


def put_resource_class(call: Call, data: Any) -> Any:
    name = call.path("name")
    if call.at_least(1, 7):
        schemas.validate({"name": name}, schemas.POST_RC)
        existed = name in call.source().known_names()[0]
        # Stored even where a hypervisor's inventories name it already: a class
        # a client made stays when they no longer do, as in Placement.
        created = service.create_custom(call.store, "resource-class", name)
        call.status = 201 if created and not existed else 204
        call.headers["location"] = f"{call.mount}/resource_classes/{name}"
        return None
    schemas.validate(data, schemas.POST_RC)
    if name in RESOURCE_CLASSES:
        raise PlacementBadRequest(f"Cannot update standard resource class {name}")
    new = service.rename_resource_class(call.source(), name, data["name"])
    call.last_modified = _now()
    return {"name": new, "links": [{"rel": "self", "href": f"{call.mount}/resource_classes/{new}"}]}


def delete_resource_class(call: Call, _: Any) -> None:
    service.delete_resource_class(call.source(), call.path("name"))
    call.status = 204


# -- traits -----------------------------------------------------------------------------


def list_traits(call: Call, _: Any) -> Any:
    schemas.validate_query({k: v[0] for k, v in call.params.items()}, schemas.LIST_TRAIT)
    names = list(call.source().known_names()[1])
    name = call.one("name")
    if name is not None:
        op, _, value = name.partition(":")
        if op == "in":
            wanted = set(value.split(","))
            names = [n for n in names if n in wanted]
        elif op == "startswith":
            names = [n for n in names if n.startswith(value)]
        else:
            raise PlacementBadRequest(
                f"Badly formatted name parameter. Expected name query string parameter in form: "
                f"?name=[in|startswith]:[name1,name2|prefix]. Got: \"{name}\"")
    assoc = call.one("associated")
    if assoc is not None:
        if assoc.lower() not in ("true", "false"):
            raise PlacementBadRequest('The query parameter "associated" only accepts "true" or "false"')
        used = set().union(*(p.traits for p in call.source().fleet().providers.values()))
        names = [n for n in names if (n in used) == (assoc.lower() == "true")]
    call.last_modified = _now()
    return {"traits": sorted(names)}


def get_trait(call: Call, _: Any) -> Any:
    name = call.path("name")
    if name not in call.source().known_names()[1]:
        raise PlacementNotFound(f"No such trait(s): {name}.")
    call.last_modified = _now()
    call.status = 204
    return None


def put_trait(call: Call, _: Any) -> Any:
    name = call.path("name")
    import re

    if not re.fullmatch(schemas.CUSTOM_PATTERN, name) or len(name) > 255:
        raise PlacementBadRequest(
            'The trait is invalid. A valid trait must be no longer than 255 characters, start with '
            'the prefix "CUSTOM_" and use following characters: "A"-"Z", "0"-"9" and "_"')
    created = service.create_custom(call.store, "trait", name)
    call.status = 201 if created else 204
    call.headers["location"] = f"{call.mount}/traits/{name}"
    call.last_modified = _now()
    return None


def delete_trait(call: Call, _: Any) -> None:
    service.delete_trait(call.source(), call.path("name"))
    call.status = 204


def _provider_traits_doc(call: Call, p: ProviderView) -> dict[str, Any]:
    call.last_modified = _stamp(p)
    return {"resource_provider_generation": p.generation, "traits": sorted(p.traits)}


def get_provider_traits(call: Call, _: Any) -> Any:
    uuid = call.path("uuid")
    p = call.source().fleet().providers.get(uuid)
    if p is None:
        raise PlacementNotFound(
            f"No resource provider with uuid {uuid} found: No resource provider with uuid {uuid} found")
    return _provider_traits_doc(call, p)


def put_provider_traits(call: Call, data: Any) -> Any:
    schemas.validate(data, schemas.SET_TRAITS_FOR_RP)
    p = service.set_provider_traits(call.source(), call.path("uuid"), data["resource_provider_generation"],
                                    data["traits"])
    return _provider_traits_doc(call, p)


def delete_provider_traits(call: Call, _: Any) -> None:
    fleet = call.source().fleet()
    p = fleet.provider(call.path("uuid"))
    service.set_provider_traits(call.source(), p.uuid, p.generation, [])
    call.status = 204


# -- aggregates -------------------------------------------------------------------------


def _aggregates_doc(call: Call, p: ProviderView) -> dict[str, Any]:
    call.last_modified = _stamp(p)
    out: dict[str, Any] = {"aggregates": list(p.aggregates)}
    if call.at_least(1, 19):
        out["resource_provider_generation"] = p.generation
    return out


def get_aggregates(call: Call, _: Any) -> Any:
    return _aggregates_doc(call, call.source().fleet().provider(call.path("uuid")))


def put_aggregates(call: Call, data: Any) -> Any:
    call.source().fleet().provider(call.path("uuid"))  # Placement answers 404 before 400
    if call.at_least(1, 19):
        schemas.validate(data, schemas.PUT_AGGREGATES_1_19)
        aggs, gen = data["aggregates"], data["resource_provider_generation"]
    else:
        schemas.validate(data, schemas.PUT_AGGREGATES_1_1)
        aggs, gen = data, None
    p = service.set_aggregates(call.source(), call.path("uuid"), gen, aggs)
    return _aggregates_doc(call, p)


# -- allocations ------------------------------------------------------------------------


def get_allocations(call: Call, _: Any) -> Any:
    consumer = call.path("consumer")
    found = alloc.consumer_allocations(call.source(), consumer)
    call.last_modified = _now()
    out: dict[str, Any] = {"allocations": {
        rp: ({"resources": res} | ({"generation": found.generations[rp]}))
        for rp, res in found.allocations.items()}}
    if call.at_least(1, 12) and found.allocations:
        rec = found.record
        out["project_id"] = rec.spec.project_id if rec else alloc.INCOMPLETE
        out["user_id"] = rec.spec.user_id if rec else alloc.INCOMPLETE
    if call.at_least(1, 28) and found.allocations:
        out["consumer_generation"] = alloc.consumer_generation(found.record, True)
    if call.at_least(1, 38) and found.allocations:
        out["consumer_type"] = (found.record.spec.consumer_type if found.record else None) or "unknown"
    return out


def _request_of(call: Call, consumer: str, data: dict[str, Any]) -> alloc.ConsumerRequest:
    raw = data["allocations"]
    if isinstance(raw, list):
        allocations = {a["resource_provider"]["uuid"]: dict(a["resources"]) for a in raw}
    else:
        allocations = {rp: dict(a["resources"]) for rp, a in raw.items()}
    return alloc.ConsumerRequest(
        consumer=consumer, allocations=allocations, project_id=data.get("project_id"),
        user_id=data.get("user_id"), consumer_generation=data.get("consumer_generation"),
        check_generation=call.at_least(1, 28), consumer_type=data.get("consumer_type"))


def put_allocations(call: Call, data: Any) -> Any:
    consumer = alloc.normalize_consumer(call.path("consumer"))
    schema = (schemas.ALLOCATION_1_38 if call.at_least(1, 38) else schemas.ALLOCATION_1_34
              if call.at_least(1, 34) else schemas.ALLOCATION_1_28 if call.at_least(1, 28)
              else schemas.ALLOCATION_1_12 if call.at_least(1, 12) else schemas.ALLOCATION_1_8
              if call.at_least(1, 8) else schemas.ALLOCATION_1_0)
    schemas.validate(data, schema)
    req = _request_of(call, consumer, data)
    alloc.set_allocations(src := call.source(), [req])
    if not req.allocations:
        alloc.drop_empty_consumer(src, consumer)
    call.status = 204
    return None


def post_allocations(call: Call, data: Any) -> Any:
    schema = (schemas.POST_ALLOCATIONS_1_38 if call.at_least(1, 38) else schemas.POST_ALLOCATIONS_1_34
              if call.at_least(1, 34) else schemas.POST_ALLOCATIONS_1_28 if call.at_least(1, 28)
              else schemas.POST_ALLOCATIONS_1_13)
    schemas.validate(data, schema)
    reqs = [_request_of(call, c, body) for c, body in data.items()]
    alloc.set_allocations(src := call.source(), reqs)
    for r in reqs:
        if not r.allocations:
            alloc.drop_empty_consumer(src, r.consumer)
    call.status = 204
    return None


def reshape(call: Call, data: Any) -> Any:
    allocations = (schemas.POST_ALLOCATIONS_1_38 if call.at_least(1, 38) else schemas.POST_ALLOCATIONS_1_34
                   if call.at_least(1, 34) else schemas.POST_ALLOCATIONS_1_28)
    schemas.validate(data, schemas.reshaper(allocations))
    reqs = [_request_of(call, c, body) for c, body in data["allocations"].items()]
    inventories = {rp: (body["resource_provider_generation"], body["inventories"])
                   for rp, body in data["inventories"].items()}
    alloc.set_allocations(src := call.source(), reqs, inventories)
    for r in reqs:
        alloc.drop_empty_consumer(src, r.consumer)
    call.status = 204
    return None


def delete_allocations(call: Call, _: Any) -> None:
    alloc.delete_allocations(call.source(), call.path("consumer"))
    call.status = 204


def provider_allocations(call: Call, _: Any) -> Any:
    fleet = call.source().fleet()
    uuid = call.path("uuid")
    allocs = alloc.provider_allocations(fleet, uuid)
    call.last_modified = _now()
    out: dict[str, dict[str, Any]] = {c: {"resources": r} for c, r in allocs.items()}
    if call.at_least(1, 28):  # each consumer's generation (0: hvfleet's claims, no record)
        src = call.source()
        for c, doc in out.items():
            doc["consumer_generation"] = alloc.consumer_generation(src.consumer(c), True)
    return {"resource_provider_generation": fleet.providers[uuid].generation, "allocations": out}


# -- allocation candidates ----------------------------------------------------------------


def allocation_candidates(call: Call, _: Any) -> Any:
    """Answered from the server's provider snapshot (kept current from the
    store's watch), by the pure search of hvfleet.placement.candidates; the
    body is kept with the snapshot's graph until anything changes."""
    try:
        snap = call.snapshot()
        classes, traits = snap.known_names()
        body = candidates.candidates_json(snap.graph(), call.params, call.version,
                                          resource_classes=classes, traits=traits)
    except candidates.PlacementBadRequest as exc:
        raise PlacementBadRequest(exc.detail, code=exc.code) from None
    call.last_modified = _now()
    return EncodedJSON(body)


def kept_allocation_candidates(call: Call) -> EncodedJSON | None:
    """`allocation_candidates`' answer when it is kept with the current graph
    and that can be known at once (the store's change mark says nothing was
    written since the snapshot caught up, on any replica; nothing waits for a
    lock): answered on the event loop, without the hand-off to a worker
    thread. None otherwise (etcd, a change since, a query not asked before
    over this graph, a refusal): the edge then calls `allocation_candidates`."""
    snap = call.request.app.state.ctx.loaded_placement_snapshot()
    if snap is None:
        return None
    graph = snap.kept_graph(call.store)
    known = snap.kept_known_names()
    if graph is None or known is None:
        return None
    body = candidates.kept_candidates_json(graph, call.params, call.version, known)
    if body is None:
        return None
    call.last_modified = _now()
    return EncodedJSON(body)


__all__ = ["TRAITS"]
