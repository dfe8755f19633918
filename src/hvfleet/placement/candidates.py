"""`GET /allocation_candidates` over the in-memory provider graph: the query
parser (`parse_candidates_query`), the search (`find_candidates`) and the
answer document (`render_candidates`), each as OpenStack Placement 16.0
defines it at the caller's microversion. Pure: values in, values out; the
Placement edge negotiates the microversion and maps `PlacementBadRequest` to
Placement's 400 error body.

The search follows Placement's own algorithm step by step (per request group:
providers with capacity, trait and aggregate filters, whole trees and sharing
providers for the unsuffixed group; then the product of the groups per anchor
root, `group_policy`, `same_subtree`, the folded capacity check, the
pre-1.29 nested filter and `limit`), including its quirks, because clients
compare our answers with Placement's: the differential test holds them equal.
Where Placement's order is unspecified (it builds sets), ours is the graph's
provider order. The graph is indexed once (numpy columns per resource class,
providers by trait and by aggregate) and the index kept with the graph.
"""

from __future__ import annotations

import copy
import itertools
import json
import pprint
import re
import textwrap
import weakref
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

import numpy as np
import numpy.typing as npt

from hvfleet.model.bounds import INT64_MAX
from hvfleet.placement.errors import PlacementBadRequest as PlacementBadRequest  # raised by its parser
from hvfleet.placement.graph import Inventory, Provider, ProviderGraph
from hvfleet.placement.query import parse_member_of, uuid_like

Microversion = tuple[int, int]

SHARES_VIA_AGGREGATE = "MISC_SHARES_VIA_AGGREGATE"

# Placement's error codes for query strings (placement/errors.py).
CODE_DEFAULT = "placement.undefined_code"
CODE_BAD_VALUE = "placement.query.bad_value"
CODE_MISSING_VALUE = "placement.query.missing_value"
CODE_DUPLICATE_KEY = "placement.query.duplicate_key"


# ---------------------------------------------------------------------------
# The query


@dataclass(frozen=True, slots=True)
class RequestGroup:
    """One request group: the unsuffixed one (its resources may come from
    several providers of one tree and sharing providers) or a suffixed one
    (all from one provider)."""

    suffix: str
    resources: tuple[tuple[str, int], ...] = ()  # resource class, amount; in query order
    required_traits: tuple[frozenset[str], ...] = ()  # each set: any of
    forbidden_traits: frozenset[str] = frozenset()
    member_of: tuple[frozenset[str], ...] = ()  # each set: any of
    forbidden_aggregates: frozenset[str] = frozenset()
    in_tree: str | None = None

    @property
    def use_same_provider(self) -> bool:
        return bool(self.suffix)


@dataclass(frozen=True, slots=True)
class CandidatesQuery:
    groups: tuple[RequestGroup, ...]
    limit: int | None = None
    group_policy: str | None = None
    root_required: frozenset[str] = frozenset()
    root_forbidden: frozenset[str] = frozenset()
    same_subtrees: tuple[frozenset[str], ...] = ()
    nested_aware: bool = True  # microversion >= 1.29

    @property
    def requested_classes(self) -> frozenset[str]:
        return frozenset(rc for g in self.groups for rc, _ in g.resources)


_GROUP_PAT = r"[1-9][0-9]*"
_GROUP_PAT_1_33 = r"[a-zA-Z0-9_-]{1,64}"
_KEY = re.compile(rf"^(resources|required|member_of|in_tree)({_GROUP_PAT})?$")
_KEY_1_33 = re.compile(rf"^(resources|required|member_of|in_tree)({_GROUP_PAT_1_33})?$")
_LIMIT_PATTERN = "^[1-9][0-9]*$"


def _schema(mv: Microversion) -> dict[str, Any]:
    """Placement's JSON schema for the query at `mv`, built as Placement
    builds it (key order included: its error messages print it)."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"resources": {"type": "string"}},
        "required": ["resources"],
        "additionalProperties": False,
    }
    props = schema["properties"]
    if mv >= (1, 16):
        props["limit"] = {
            "type": ["integer", "string"],
            "pattern": _LIMIT_PATTERN,
            "minimum": 1,
            "minLength": 1,
        }
    if mv >= (1, 17):
        props["required"] = {"type": ["string"]}
    if mv >= (1, 21):
        props["member_of"] = {"type": ["string"]}
    if mv >= (1, 25):
        for name in ("resources", "required", "member_of"):
            del props[name]
        del schema["required"]
        group = _GROUP_PAT_1_33 if mv >= (1, 33) else _GROUP_PAT
        prefixes = ["resources", "required", "member_of"] + (["in_tree"] if mv >= (1, 31) else [])
        schema["patternProperties"] = {f"^{p}({group})?$": {"type": "string"} for p in prefixes}
        props["group_policy"] = {"type": "string", "enum": ["none", "isolate"]}
    if mv >= (1, 35):
        props["root_required"] = {"type": ["string"]}
    if mv >= (1, 36):
        props["same_subtree"] = {"type": ["string"]}
    return schema


def _schema_error(
    message: str, validator: str, schema: object, instance: object, at: str | None = None
) -> PlacementBadRequest:
    """jsonschema's text for an error (message, then the failing schema and
    instance pretty-printed), as Placement puts it in its 400."""
    where = "" if at is None else f"[{at!r}]"
    schema_path = "schema" if at is None else f"schema['properties']{where}"

    def pretty(thing: object) -> str:
        return textwrap.indent(pprint.pformat(thing, width=72, sort_dicts=False), "    ").lstrip()

    return PlacementBadRequest(
        f"Invalid query string parameters: {message}\n\n"
        f"Failed validating {validator!r} in {schema_path}:\n    {pretty(schema)}\n\n"
        f"On instance{where}:\n    {pretty(instance)}"
    )


def _validate_schema(params: Mapping[str, Sequence[str]], mv: Microversion) -> None:
    """jsonschema's best error for Placement's schema, on the query as
    Placement validates it (each key's last value)."""
    schema = _schema(mv)
    props: dict[str, Any] = schema["properties"]
    patterns = list(schema.get("patternProperties", {}))
    last = {k: v[-1] for k, v in params.items() if v}
    if "required" in schema and "resources" not in last:
        raise _schema_error("'resources' is a required property", "required", schema, last)
    extras = [k for k in last if k not in props and not any(re.search(p, k) for p in patterns)]
    if extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(e) for e in sorted(extras))
            regexes = ", ".join(repr(p) for p in sorted(patterns))
            message = f"{joined} {verb} not match any of the regexes: {regexes}"
        else:
            verb = "was" if len(extras) == 1 else "were"
            joined = ", ".join(repr(e) for e in extras)
            message = f"Additional properties are not allowed ({joined} {verb} unexpected)"
        raise _schema_error(message, "additionalProperties", schema, last)
    for name in props:
        if name not in last:
            continue
        value = last[name]
        if name == "limit" and not re.search(_LIMIT_PATTERN, value):
            message = f"{value!r} does not match {_LIMIT_PATTERN!r}"
            raise _schema_error(message, "pattern", props[name], value, name)
        if name == "group_policy" and value not in ("none", "isolate"):
            raise _schema_error(
                f"{value!r} is not one of ['none', 'isolate']", "enum", props[name], value, name
            )


def _parse_resources(value: str) -> dict[str, int]:
    form = "Expected resources query string parameter in form: ?resources=VCPU:2,MEMORY_MB:1024."
    if value.strip() == "":
        raise PlacementBadRequest(f"Badly formed resources parameter. {form} Got: empty string.")
    out: dict[str, int] = {}
    for item in value.split(","):
        parts = item.split(":")
        if len(parts) != 2:
            raise PlacementBadRequest(f"Badly formed resources parameter. {form} Got: {item}.")
        name, text = parts
        try:
            amount = int(text)
        except ValueError:
            raise PlacementBadRequest(
                f"Requested resource {name} expected positive integer amount. Got: {text}."
            ) from None
        if amount < 1:
            raise PlacementBadRequest(f"Requested resource {name} requires amount >= 1. Got: {amount}.")
        out[name] = amount
    return out


def _parse_traits(
    value: str, allow_forbidden: bool, allow_any: bool
) -> tuple[list[frozenset[str]], set[str]]:
    if value.startswith("in:"):
        if not allow_any:
            raise PlacementBadRequest(
                "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' "
                f"only supported since microversion 1.39. Got: {value}"
            )
        any_of = {s.strip() for s in value[3:].split(",")}
        if not all(any_of):
            raise PlacementBadRequest(
                "Invalid query string parameters: Expected 'required' parameter value of the "
                f"form: in:HW_CPU_X86_VMX,CUSTOM_MAGIC. Got an empty trait in: {value}"
            )
        if any(t.startswith("!") for t in any_of):
            raise PlacementBadRequest(
                "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' "
                f"does not support forbidden traits. Got: {value}"
            )
        return [frozenset(any_of)], set()
    names = [s.strip() for s in value.split(",")]
    # Placement strips any number of leading '!' (a documented-as-kept bug).
    forbidden = {t.lstrip("!") for t in names if t.startswith("!")}
    if not all(itertools.chain(forbidden, names)):
        form = "HW_CPU_X86_VMX,!CUSTOM_MAGIC" if allow_forbidden else "HW_CPU_X86_VMX,CUSTOM_MAGIC"
        raise PlacementBadRequest(
            "Invalid query string parameters: Expected 'required' parameter value of the "
            f"form: {form}. Got an empty trait in: {value}"
        )
    if forbidden and not allow_forbidden:
        raise PlacementBadRequest(
            "Invalid query string parameters: Expected 'required' parameter value of the "
            f"form: HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: {value}"
        )
    return [frozenset({t}) for t in names if not t.startswith("!")], forbidden


def _parse_member_of(
    values: Sequence[str], suffix: str, mv: Microversion
) -> tuple[list[frozenset[str]], set[str]]:
    member_of = parse_member_of(values, mv, suffix)
    return list(member_of.required), set(member_of.forbidden)


@dataclass
class _GroupDraft:
    resources: dict[str, int] = field(default_factory=dict)
    required: list[frozenset[str]] = field(default_factory=list)
    forbidden: set[str] = field(default_factory=set)
    member_of: list[frozenset[str]] = field(default_factory=list)
    forbidden_aggs: set[str] = field(default_factory=set)
    in_tree: str | None = None


def parse_candidates_query(
    params: Mapping[str, Sequence[str]], microversion: Microversion
) -> CandidatesQuery:
    """The query string of `GET /allocation_candidates` (each key with its
    values in query order) at `microversion` (1.10 or later), checked where
    and as Placement checks it."""
    mv = microversion
    _validate_schema(params, mv)

    limit = int(params["limit"][0]) if params.get("limit") else None
    group_policy = params["group_policy"][0] if params.get("group_policy") else None
    root_required: frozenset[str] = frozenset()
    root_forbidden: frozenset[str] = frozenset()
    if params.get("root_required"):
        values = params["root_required"]
        if len(values) > 1:
            raise PlacementBadRequest(
                "Query parameter 'root_required' may be specified only once.", CODE_DUPLICATE_KEY
            )
        req, forb = _parse_traits(values[0], allow_forbidden=True, allow_any=False)
        root_required = frozenset(t for s in req for t in s)
        root_forbidden = frozenset(forb)
        conflicts = root_required & root_forbidden
        if conflicts:
            raise PlacementBadRequest(
                "Conflicting required and forbidden traits found in root_required: "
                + ", ".join(sorted(conflicts)),
                CODE_BAD_VALUE,
            )
    same_subtrees: list[frozenset[str]] = []
    for value in params.get("same_subtree", ()):
        suffixes = frozenset(s.strip() for s in value.split(","))
        if "" in suffixes:
            raise PlacementBadRequest(
                "Empty string (unsuffixed group) can not be specified in `same_subtree` ", CODE_BAD_VALUE
            )
        same_subtrees.append(suffixes)

    pattern = _KEY_1_33 if mv >= (1, 33) else _KEY
    drafts: dict[str, _GroupDraft] = {}
    for key, values in params.items():
        match = pattern.match(key)
        if not match:
            continue
        prefix, suffix = match.group(1), match.group(2) or ""
        draft = drafts.setdefault(suffix, _GroupDraft())
        for value in values:
            if prefix == "resources":
                draft.resources = _parse_resources(value)
            elif prefix == "required":
                wanted = values if mv >= (1, 39) else values[-1:]
                draft.required, draft.forbidden = [], set()
                for v in wanted:
                    r, f = _parse_traits(v, allow_forbidden=mv >= (1, 22), allow_any=mv >= (1, 39))
                    draft.required += r
                    draft.forbidden |= f
            elif prefix == "member_of":
                draft.member_of, draft.forbidden_aggs = _parse_member_of(values, suffix, mv)
            else:
                draft.in_tree = _parse_in_tree(value)

    if mv >= (1, 36):
        resourceless = [s for s, d in drafts.items() if not d.resources]
        subtree_suffixes = set().union(*same_subtrees)
        if len(resourceless) == len(drafts):
            raise PlacementBadRequest(
                "There must be at least one resources or resources[$S] parameter.", CODE_MISSING_VALUE
            )
        bad = [s for s in resourceless if s not in subtree_suffixes]
        if bad:
            raise PlacementBadRequest(
                "Resourceless suffixed group request should be specified in `same_subtree` "
                f"query param: bad group(s) - {_pylist(bad)}.",
                CODE_BAD_VALUE,
            )
        bad = [s for s in _set_order(subtree_suffixes) if s not in drafts]
        if bad:
            raise PlacementBadRequest(
                f"Real suffixes should be specified in `same_subtree`: {_pylist(bad)} not found in "
                f"{_pylist(list(drafts))}.",
                CODE_BAD_VALUE,
            )
    else:
        _check_orphans(drafts)
    if mv >= (1, 22):
        conflicting = [
            f"required{s}: ({', '.join(sorted(any_of))})"
            for s, d in drafts.items()
            for any_of in d.required
            if all(t in d.forbidden for t in any_of)
        ]
        if conflicting:
            raise PlacementBadRequest(
                "Conflicting required and forbidden traits found in the following traits keys: "
                + ", ".join(sorted(conflicting))
            )
    if not group_policy and sum(1 for s in drafts if s) > 1:
        raise PlacementBadRequest(
            'The "group_policy" parameter is required when specifying more than one '
            '"resources{N}" parameter.'
        )
    groups = tuple(
        RequestGroup(
            suffix=s,
            resources=tuple(d.resources.items()),
            required_traits=tuple(d.required),
            forbidden_traits=frozenset(d.forbidden),
            member_of=tuple(d.member_of),
            forbidden_aggregates=frozenset(d.forbidden_aggs),
            in_tree=d.in_tree,
        )
        for s, d in drafts.items()
    )
    return CandidatesQuery(
        groups=groups,
        limit=limit,
        group_policy=group_policy,
        root_required=root_required,
        root_forbidden=root_forbidden,
        same_subtrees=tuple(same_subtrees),
        nested_aware=mv >= (1, 29),
    )


def _pylist(items: Iterable[str]) -> str:
    return "[" + ", ".join(repr(i) for i in items) + "]"


def _set_order(items: Iterable[str]) -> list[str]:
    return sorted(items)


def _parse_in_tree(value: str) -> str:
    out = value.strip()
    if not uuid_like(out):
        raise PlacementBadRequest(
            "Invalid query string parameters: Expected 'in_tree' parameter to be a format of "
            f"uuid. Got: {value}"
        )
    return out


def _check_orphans(drafts: Mapping[str, _GroupDraft]) -> None:
    orphans = [f"required{s}" for s, d in drafts.items() if d.required and not d.resources]
    if orphans:
        raise PlacementBadRequest(
            "All traits parameters must be associated with resources.  Found the following "
            "orphaned traits keys: " + ", ".join(orphans)
        )
    orphans = [
        f"member_of{s}" for s, d in drafts.items() if not d.resources and (d.member_of or d.forbidden_aggs)
    ]
    if orphans:
        raise PlacementBadRequest(
            "All member_of parameters must be associated with resources. Found the following "
            "orphaned member_of keys: " + ", ".join(orphans)
        )
    if not all(d.resources for d in drafts.values()):
        raise PlacementBadRequest("All request groups must specify resources.")
    if not drafts:
        raise PlacementBadRequest(
            "At least one request group (`resources` or `resources{$S}`) is required."
        )


# ---------------------------------------------------------------------------
# The answer


@dataclass(frozen=True, slots=True)
class AllocationRequest:
    allocations: Mapping[str, Mapping[str, int]]  # provider uuid -> resource class -> amount
    mappings: Mapping[str, tuple[str, ...]]  # group suffix -> provider uuids
    # Its text by form (_request_form): a one-provider request is kept by the
    # index and served by many answers. Read-only, like the rest.
    encoded: dict[int, str] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ProviderSummary:
    uuid: str
    parent_uuid: str | None
    root_uuid: str
    resources: Mapping[str, tuple[int, int]]  # resource class -> (capacity, used)
    traits: tuple[str, ...]
    # Rendered forms by (all classes, traits, tree): a summary is a value of
    # its graph, asked for by many answers. Read-only, like the rest.
    rendered: dict[tuple[bool, bool, bool], dict[str, object]] = field(
        default_factory=dict, compare=False, repr=False
    )
    encoded: dict[tuple[bool, bool, bool], str] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class CandidatesAnswer:
    allocation_requests: tuple[AllocationRequest, ...]
    provider_summaries: tuple[ProviderSummary, ...]
    requested_classes: frozenset[str]


def render_candidates(answer: CandidatesAnswer, microversion: Microversion) -> dict[str, object]:
    """The JSON body Placement 16.0 sends at `microversion`."""
    mv = microversion
    requests: list[dict[str, object]] = []
    for ar in answer.allocation_requests:
        if mv >= (1, 12):
            doc: dict[str, object] = {
                "allocations": {u: {"resources": dict(res)} for u, res in ar.allocations.items()}
            }
            if mv >= (1, 34):
                doc["mappings"] = {s: list(us) for s, us in ar.mappings.items()}
        else:
            doc = _request_before_1_12(ar)
        requests.append(doc)
    summaries: dict[str, object] = {}
    for ps in answer.provider_summaries:
        summaries[ps.uuid] = _summary_entry(ps, mv, answer.requested_classes)
    return {"allocation_requests": requests, "provider_summaries": summaries}


def render_candidates_json(answer: CandidatesAnswer, microversion: Microversion) -> str:
    """`json.dumps(render_candidates(answer, microversion))`, the same text,
    put together from pieces: a provider summary's text is made once per
    graph (it does not depend on the query from 1.27), and the resources
    every request of an answer shares are encoded once. At 10,000 providers
    the summaries are most of the body."""
    mv = microversion
    dumps, quote = json.dumps, encode_basestring_ascii  # quote(s) is dumps(s), without its setup
    encoded: dict[int, str] = {}  # by id(): the answer holds every one while we run

    def resources(res: Mapping[str, int]) -> str:
        text = encoded.get(id(res))
        if text is None:
            text = encoded[id(res)] = dumps(dict(res))
        return text

    form = _request_form(mv)

    def request(ar: AllocationRequest) -> str:
        if form == 0:
            text = dumps(_request_before_1_12(ar))
        else:
            allocs = ", ".join([f'{quote(u)}: {{"resources": {resources(res)}}}'
                                for u, res in ar.allocations.items()])
            if form == 2:
                maps = ", ".join([f"{quote(s)}: [{', '.join([quote(u) for u in us])}]"
                                  for s, us in ar.mappings.items()])
                text = f'{{"allocations": {{{allocs}}}, "mappings": {{{maps}}}}}'
            else:
                text = f'{{"allocations": {{{allocs}}}}}'
        ar.encoded[form] = text
        return text

    all_classes = mv >= (1, 27)
    flags = _summary_flags(mv)

    def summary(ps: ProviderSummary) -> str:
        text = f"{quote(ps.uuid)}: {dumps(_summary_entry(ps, mv, answer.requested_classes))}"
        if all_classes:
            ps.encoded[flags] = text
        return text

    # Comprehensions over the kept texts (most of them, after the first answer).
    requests = [ar.encoded.get(form) or request(ar) for ar in answer.allocation_requests]
    shown = answer.provider_summaries
    if len({ps.uuid for ps in shown}) != len(shown):  # each provider once, where it first came
        first: dict[str, ProviderSummary] = {}
        for ps in shown:
            first.setdefault(ps.uuid, ps)
        shown = tuple(first.values())
    if all_classes:
        summaries = [ps.encoded.get(flags) or summary(ps) for ps in shown]
    else:
        summaries = [summary(ps) for ps in shown]
    return (f'{{"allocation_requests": [{", ".join(requests)}], '
            f'"provider_summaries": {{{", ".join(summaries)}}}}}')


def _request_form(mv: Microversion) -> int:
    """An allocation request's form at `mv`: a list (before 1.12), a map, a map with mappings (1.34)."""
    return 0 if mv < (1, 12) else 1 if mv < (1, 34) else 2


def _request_before_1_12(ar: AllocationRequest) -> dict[str, object]:
    return {
        "allocations": [
            {"resource_provider": {"uuid": u}, "resources": dict(res)} for u, res in ar.allocations.items()
        ]
    }


def _summary_flags(mv: Microversion) -> tuple[bool, bool, bool]:
    """What a summary shows at `mv`: every class (1.27), traits (1.17), its tree (1.29)."""
    return (mv >= (1, 27), mv >= (1, 17), mv >= (1, 29))


def _summary_entry(ps: ProviderSummary, mv: Microversion, requested: frozenset[str]) -> dict[str, object]:
    """A provider summary's document at `mv`: made once per summary and
    version form from 1.27 (then it does not depend on the request)."""
    flags = _summary_flags(mv)
    all_classes = flags[0]
    if all_classes and (done := ps.rendered.get(flags)) is not None:
        return done
    entry: dict[str, object] = {
        "resources": {
            rc: {"capacity": cap, "used": used}
            for rc, (cap, used) in ps.resources.items()
            if all_classes or rc in requested
        }
    }
    if flags[1]:
        entry["traits"] = list(ps.traits)
    if flags[2]:
        entry["parent_provider_uuid"] = ps.parent_uuid
        entry["root_provider_uuid"] = ps.root_uuid
    if all_classes:
        ps.rendered[flags] = entry
    return entry


# ---------------------------------------------------------------------------
# The index of a graph


IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class _ClassColumns:
    """One resource class's inventories, a row per provider that has one."""

    provider: IntArray
    root: IntArray
    # Compared in float64, as Placement's SQL compares used + amount with the
    # float (total - reserved) * allocation_ratio: exact below 2**53, and no
    # sum or column overflows whatever a provider holds (at the largest ratio
    # Placement takes a capacity has 48 digits; a Hypervisor's status may say
    # 10**21 CPUs). The int() of `limit` (what summaries show and merges
    # check) is kept as a Python int (`summary_resources`).
    limit: FloatArray
    used: FloatArray
    max_unit: FloatArray
    # int64 where every value fits (`_exact`: a modulo of int64 is three times
    # quicker than of float64), else float64.
    min_unit: npt.NDArray[np.int64] | FloatArray
    step_size: npt.NDArray[np.int64] | FloatArray


class _Index:
    """A graph's providers by position (the graph's order), with numpy
    columns per resource class and sets by trait and aggregate. Built whole
    for a graph, or derived from the index of the graph it was derived from
    (`derive`): a claim or a status write changes a few providers' numbers,
    and only those rows are rewritten, in copies, so an index stays a value."""

    def __init__(self, graph: ProviderGraph) -> None:
        providers = list(graph.providers.values())
        self.providers = providers
        self.uuids = [p.uuid for p in providers]
        self.pos = {u: i for i, u in enumerate(self.uuids)}
        self.root = [self.pos[p.root_uuid] for p in providers]
        self.parent: list[int | None] = [
            None if p.parent_uuid is None else self.pos[p.parent_uuid] for p in providers
        ]
        self.has_trees = any(p.parent_uuid is not None for p in providers)
        self.traits = [p.traits for p in providers]
        self.aggregates = [p.aggregates for p in providers]
        by_trait: dict[str, set[int]] = defaultdict(set)
        by_agg: dict[str, set[int]] = defaultdict(set)
        trees: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(providers):
            for t in p.traits:
                by_trait[t].add(i)
            for a in p.aggregates:
                by_agg[a].add(i)
            trees[self.root[i]].append(i)
        self.by_trait = dict(by_trait)
        self.by_agg = dict(by_agg)
        self.trees = dict(trees)
        self.roots = [i for i, p in enumerate(providers) if p.parent_uuid is None]
        self.sharing = frozenset(self.by_trait.get(SHARES_VIA_AGGREGATE, ()))
        rows: dict[str, list[tuple[int, int, float, int, int, int, int]]] = defaultdict(list)
        self.summary_resources: list[dict[str, tuple[int, int]]] = []
        self.max_units: list[dict[str, int]] = []
        for i, p in enumerate(providers):
            res: dict[str, tuple[int, int]] = {}
            for rc, inv in p.inventories.items():
                limit, used = _limit(inv), p.usages.get(rc, 0)
                rows[rc].append((i, self.root[i], limit, used, inv.min_unit, inv.max_unit, inv.step_size))
                res[rc] = (int(limit), used)
            self.summary_resources.append(res)
            self.max_units.append({rc: inv.max_unit for rc, inv in p.inventories.items()})
        self.summaries: dict[int, ProviderSummary] = {}  # made on first use
        # One-provider requests by (resources, suffix), by provider position:
        # they depend on a provider's uuid only, so a derived index (the same
        # providers in the same order) shares them (_single_answer).
        self.single_requests: dict[tuple[object, ...], list[AllocationRequest | None]] = {}
        self.answers: dict[tuple[object, ...], bytes] = {}  # candidates_json's bodies for this graph
        self.columns: dict[str, _ClassColumns] = {}
        self.rows: dict[str, dict[int, int]] = {}  # class -> provider -> its row in the columns
        for rc, rs in rows.items():
            cols = list(zip(*rs, strict=True))
            self.columns[rc] = _ClassColumns(
                provider=np.array(cols[0], dtype=np.int64),
                root=np.array(cols[1], dtype=np.int64),
                limit=np.array(cols[2], dtype=np.float64),
                used=np.array(cols[3], dtype=np.float64),
                max_unit=np.array(cols[5], dtype=np.float64),
                min_unit=_exact(cols[4]),
                step_size=_exact(cols[6]),
            )
            self.rows[rc] = {int(p): row for row, p in enumerate(cols[0])}

    def derive(self, graph: ProviderGraph, changed: Collection[str]) -> _Index | None:
        """The index of `graph`, which equals this index's graph but for the
        providers in `changed`; None when a change is one of structure (a
        provider added or removed, moved in its tree, or given or losing a
        resource class: then the whole index is built again)."""
        if len(graph.providers) != len(self.uuids) or list(graph.providers) != self.uuids:
            return None
        edits: list[tuple[int, Provider]] = []
        for u in changed:
            i = self.pos.get(u)
            p = graph.providers.get(u)
            if i is None or p is None:
                return None
            was = self.providers[i]
            if (p.parent_uuid, p.root_uuid) != (was.parent_uuid, was.root_uuid) or (
                p.inventories.keys() != was.inventories.keys()
            ):
                return None
            edits.append((i, p))
        ix = copy.copy(self)
        ix.providers = list(self.providers)
        ix.summary_resources = list(self.summary_resources)
        ix.max_units = list(self.max_units)
        ix.summaries = dict(self.summaries)
        ix.answers = {}  # every body was of the graph before
        ix.columns = dict(self.columns)
        fresh: dict[str, _ClassColumns] = {}  # columns copied for this index
        copied: set[str] = set()
        for i, p in edits:
            was = self.providers[i]
            ix.providers[i] = p
            ix.summaries.pop(i, None)
            if p.traits != was.traits:
                ix._move(i, was.traits, p.traits, "traits", "by_trait", copied)
            if p.aggregates != was.aggregates:
                ix._move(i, was.aggregates, p.aggregates, "aggregates", "by_agg", copied)
            res: dict[str, tuple[int, int]] = {}
            for rc, inv in p.inventories.items():
                limit, used = _limit(inv), p.usages.get(rc, 0)
                res[rc] = (int(limit), used)
                c = fresh.get(rc)
                if c is None:
                    old = self.columns[rc]
                    c = fresh[rc] = ix.columns[rc] = _ClassColumns(
                        old.provider, old.root, old.limit.copy(), old.used.copy(), old.max_unit.copy(),
                        old.min_unit.copy(), old.step_size.copy())
                row = self.rows[rc][i]
                c.limit[row], c.used[row], c.max_unit[row] = limit, used, inv.max_unit
                try:
                    c.min_unit[row], c.step_size[row] = inv.min_unit, inv.step_size
                except OverflowError:  # past an int64 column: built again, in float64
                    return None
            ix.summary_resources[i] = res
            ix.max_units[i] = {rc: inv.max_unit for rc, inv in p.inventories.items()}
        ix.sharing = frozenset(ix.by_trait.get(SHARES_VIA_AGGREGATE, ()))
        return ix

    def _move(self, i: int, was: frozenset[str], now: frozenset[str], per_provider: str,
              by_name: str, copied: set[str]) -> None:
        """Provider `i`'s traits (or aggregates) changed from `was` to `now`:
        the list and the sets of the names that changed, in copies (the list
        and the dict copied once per derived index, in `copied`)."""
        if per_provider not in copied:
            copied.add(per_provider)
            setattr(self, per_provider, list(getattr(self, per_provider)))
            setattr(self, by_name, dict(getattr(self, by_name)))
        listed: list[frozenset[str]] = getattr(self, per_provider)
        index: dict[str, set[int]] = getattr(self, by_name)
        listed[i] = now
        for name in was - now:
            members = index[name] - {i}
            if members:
                index[name] = members
            else:
                del index[name]
        for name in now - was:
            index[name] = index.get(name, set()) | {i}

    def with_capacity(self, rc: str, amount: int, tree_root: int | None) -> set[int]:
        """Providers where `amount` of `rc` fits: Placement's one capacity
        clause (used + amount <= (total - reserved) * ratio, min_unit <=
        amount <= max_unit, amount a multiple of step_size)."""
        c = self.columns.get(rc)
        if c is None:
            return set()
        try:
            a = float(amount)
        except OverflowError:  # more than any capacity can be
            return set()
        if amount <= INT64_MAX and c.step_size.dtype == np.int64:
            whole = amount % c.step_size == 0
        else:
            whole = np.fmod(a, c.step_size) == 0  # both positive: fmod is %
        ok = (c.used + a <= c.limit) & (c.min_unit <= a) & (c.max_unit >= a) & whole
        if tree_root is not None:
            ok &= c.root == tree_root
        return set(c.provider[ok].tolist())

    def with_all_traits(self, required: Sequence[frozenset[str]]) -> set[int]:
        out: set[int] | None = None
        for any_of in required:
            have: set[int] = set()
            for t in any_of:
                have |= self.by_trait.get(t, set())
            out = have if out is None else out & have
        return out or set()

    def with_any(self, index: Mapping[str, set[int]], names: Iterable[str]) -> set[int]:
        out: set[int] = set()
        for n in names:
            out |= index.get(n, set())
        return out

    def in_aggregates(self, member_of: Sequence[frozenset[str]]) -> set[int]:
        out: set[int] | None = None
        for any_of in member_of:
            have = self.with_any(self.by_agg, any_of)
            out = have if out is None else out & have
        return out or set()

    def sharing_anchors(self, sp: int) -> set[int]:
        """Roots of the trees a sharing provider shares with: every provider
        in one of its aggregates (itself included), by root."""
        out: set[int] = set()
        for a in self.aggregates[sp]:
            out.update(self.root[p] for p in self.by_agg[a])
        return out


# The index of each live graph, kept until the graph is gone: a graph is a
# value built once per store revision and asked many queries.
_INDEXES: dict[int, tuple[weakref.ref[ProviderGraph], _Index]] = {}


def _held(graph: ProviderGraph) -> _Index | None:
    held = _INDEXES.get(id(graph))
    return held[1] if held is not None and held[0]() is graph else None


def _index(graph: ProviderGraph) -> _Index:
    ix = _held(graph)
    if ix is not None:
        return ix
    basis = graph.basis
    if basis is not None and basis.previous is not None:
        before = _held(basis.previous)
        if before is not None:
            ix = before.derive(graph, basis.changed)
        basis.previous = None  # used (or of no use): let it go
    if ix is None:
        ix = _Index(graph)
    key = id(graph)
    _INDEXES[key] = (weakref.ref(graph, lambda _: _INDEXES.pop(key, None)), ix)
    return ix


# Bodies kept per graph (by query, microversion and known names): a scheduler
# asks a few shapes of query; each body may be megabytes at 10,000 providers.
ANSWERS_PER_GRAPH = 16
# Shapes of one-provider requests kept per fleet (a list of requests each).
SINGLE_REQUEST_SHAPES = 32


def candidates_json(
    graph: ProviderGraph,
    params: Mapping[str, Sequence[str]],
    microversion: Microversion,
    *,
    resource_classes: frozenset[str] | None = None,
    traits: frozenset[str] | None = None,
) -> bytes:
    """`render_candidates_json(find_candidates(graph, parse_candidates_query(
    params, microversion), ...), microversion)` as the bytes an HTTP answer
    carries (UTF-8, as the edge would encode the text), kept with the
    graph's index: the same query at the same microversion, over the same
    graph and the same known names, is the same body, so it is made and
    encoded once. The three are pure, so this is only memoization; any change
    to a provider (usage, inventory, trait, aggregate, ratio) is a new graph,
    and a new index with no bodies. A refused query is refused again each
    time (nothing is kept for it)."""
    ix = _index(graph)
    key = _answer_key(params, microversion, resource_classes, traits)
    body = ix.answers.get(key)
    if body is not None:
        return body
    query = parse_candidates_query(params, microversion)
    answer = find_candidates(graph, query, resource_classes=resource_classes, traits=traits)
    body = render_candidates_json(answer, microversion).encode()
    answers = ix.answers
    while len(answers) >= ANSWERS_PER_GRAPH:
        answers.pop(next(iter(answers)), None)  # the oldest
    answers[key] = body
    return body


def kept_candidates_json(graph: ProviderGraph, params: Mapping[str, Sequence[str]],
                         microversion: Microversion,
                         known: tuple[frozenset[str] | None, frozenset[str] | None]) -> bytes | None:
    """`candidates_json(graph, params, microversion, resource_classes=known[0],
    traits=known[1])` when that body is kept already (None: nothing is
    computed, not even the graph's index): a dict lookup, for a caller that
    must not do more (the server's event loop)."""
    ix = _held(graph)
    if ix is None:
        return None
    return ix.answers.get(_answer_key(params, microversion, *known))


def _answer_key(params: Mapping[str, Sequence[str]], microversion: Microversion,
                resource_classes: frozenset[str] | None, traits: frozenset[str] | None) -> tuple[object, ...]:
    return (tuple((k, tuple(v)) for k, v in params.items()), microversion, resource_classes, traits)


def _exact(values: Sequence[int]) -> npt.NDArray[np.int64] | FloatArray:
    """A column of int64 where every value fits, else of float64."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=np.float64)


def _limit(inv: Inventory) -> float:
    """What may be allocated, as Placement's SQL compares it."""
    return (inv.total - inv.reserved) * inv.allocation_ratio


# ---------------------------------------------------------------------------
# The search


class _NoProviders(Exception):
    """Placement's ResourceProviderNotFound inside the search: an empty answer."""


# One group's way of satisfying itself: (anchor root, resource requests as
# (provider, class, amount), the providers the group maps to).
@dataclass(frozen=True, slots=True)
class _Areq:
    anchor: int
    same_provider: bool
    requests: tuple[tuple[int, str, int], ...]
    mappings: tuple[tuple[str, frozenset[int]], ...]

    def key(self) -> tuple[frozenset[tuple[int, str, int]], frozenset[tuple[str, frozenset[int]]]]:
        return frozenset(self.requests), frozenset(self.mappings)


def _check_known(names: Iterable[str], known: Collection[str] | None) -> None:
    if known is None:
        return
    for n in sorted(names):
        if n not in known:
            raise PlacementBadRequest(f"No such trait(s): {n}.")


class _GroupSearch:
    """Placement's RequestGroupSearchContext: what one group may use."""

    def __init__(
        self,
        ix: _Index,
        group: RequestGroup,
        sharing: set[int],
        classes: Collection[str] | None,
        traits: Collection[str] | None,
    ) -> None:
        self.group = group
        self.resources = dict(group.resources)
        for rc in self.resources:
            if classes is not None and rc not in classes:
                raise PlacementBadRequest(
                    f"Invalid resource class in resources parameter: No such resource class {rc}."
                )
        self.rps_in_aggs: set[int] = set()
        if group.member_of:
            self.rps_in_aggs = ix.in_aggregates(group.member_of)
            if not self.rps_in_aggs:
                raise _NoProviders
        for any_of in group.required_traits:
            _check_known(any_of, traits)
        _check_known(group.forbidden_traits, traits)
        self.tree_root: int | None = None
        if group.in_tree is not None:
            at = ix.pos.get(group.in_tree)
            if at is None:
                raise _NoProviders
            self.tree_root = ix.root[at]
        self.with_resource: dict[str, set[int]] = {}
        for rc, amount in self.resources.items():
            found = ix.with_capacity(rc, amount, self.tree_root)
            if not found:
                raise _NoProviders
            self.with_resource[rc] = found
        # Placement hands every group the same set of sharing providers and
        # narrows it in place to a group's aggregates: later groups see that.
        self.sharing = sharing

    def shared_capacity(self, rc: str) -> set[int]:
        if self.rps_in_aggs:
            self.sharing &= self.rps_in_aggs
        if not self.sharing:
            return set()
        return self.sharing & self.with_resource[rc]


def _single_matches(ix: _Index, gs: _GroupSearch) -> list[int]:
    """The providers that alone satisfy a group (Placement's
    get_provider_ids_matching), in graph order."""
    g = gs.group
    filtered: set[int] = set()
    forbidden: set[int] = set()
    if g.required_traits:
        filtered = ix.with_all_traits(g.required_traits)
        if not filtered:
            return []
    if g.member_of:
        filtered = filtered & gs.rps_in_aggs if filtered else set(gs.rps_in_aggs)
        if not filtered:
            return []
    for names, index in ((g.forbidden_aggregates, ix.by_agg), (g.forbidden_traits, ix.by_trait)):
        if names:
            bad = ix.with_any(index, names)
            forbidden |= bad
            if filtered:
                filtered -= bad
                if not filtered:
                    return []
    first = True
    for rc in gs.resources:
        have = gs.with_resource[rc]
        if first:
            first = False
            filtered = filtered & have if filtered else have - forbidden
        else:
            filtered &= have
        if not filtered:
            return []
    if not gs.resources:
        filtered -= forbidden
    return sorted(filtered)


def _single_provider(ix: _Index, gs: _GroupSearch, anchors: set[int] | None) -> list[_Areq]:
    """Groups whose resources all come from one provider (Placement's
    get_provider_ids_matching and _alloc_candidates_single_provider)."""
    g = gs.group
    out: list[_Areq] = []
    requests_of = tuple(gs.resources.items())
    for rp in _single_matches(ix, gs):
        root = ix.root[rp]
        areq = _Areq(
            root,
            g.use_same_provider,
            tuple((rp, rc, amount) for rc, amount in requests_of),
            ((g.suffix, frozenset((rp,))),),
        )
        if anchors is None or root in anchors:
            out.append(areq)
        if rp in ix.sharing:
            for anchor in sorted(ix.sharing_anchors(rp)):
                if anchor == root or (anchors is not None and anchor not in anchors):
                    continue
                out.append(_Areq(anchor, areq.same_provider, areq.requests, areq.mappings))
    return out


def _trees_matching_all(
    ix: _Index, gs: _GroupSearch, anchors: set[int] | None
) -> set[tuple[int, int, str]]:
    """(provider, anchor root, class) triples for the unsuffixed group where
    trees or sharing providers exist (Placement's get_trees_matching_all)."""
    g = gs.group
    bad_aggs = ix.with_any(ix.by_agg, g.forbidden_aggregates) if g.forbidden_aggregates else set()
    cands: set[tuple[int, int, str]] = set()
    for rc in gs.resources:
        rc_c = {(p, ix.root[p], rc) for p in gs.with_resource[rc]}
        shared = gs.shared_capacity(rc)
        if shared and gs.tree_root is None:
            rc_c |= {(sp, a, rc) for sp in shared for a in ix.sharing_anchors(sp)}
        if anchors:
            rc_c = {c for c in rc_c if c[1] in anchors}
            if not rc_c:
                return set()
        if g.member_of:
            rc_c = {c for c in rc_c if c[0] in gs.rps_in_aggs or c[1] in gs.rps_in_aggs}
            if not rc_c:
                return set()
        if g.forbidden_aggregates:
            rc_c = {c for c in rc_c if c[0] not in bad_aggs and c[1] not in bad_aggs}
            if not rc_c:
                return set()
        if not cands:
            cands = rc_c
        elif rc_c:
            both = {c[1] for c in cands} & {c[1] for c in rc_c}
            cands = {c for c in cands | rc_c if c[1] in both}
        if not cands:
            return set()
    if (not g.required_traits and not g.forbidden_traits) or gs.sharing:
        return cands
    # Whole trees whose (non-forbidden) candidate providers together have
    # the required traits (Placement's _get_trees_with_traits).
    rps = {c[0] for c in cands}
    good = [rp for rp in rps if not (ix.traits[rp] & g.forbidden_traits)]
    if not g.required_traits:
        good_roots = {ix.root[rp] for rp in good}
    else:
        tree_traits: dict[int, set[str]] = defaultdict(set)
        for rp in good:
            tree_traits[ix.root[rp]] |= ix.traits[rp]
        good_roots = {r for r, ts in tree_traits.items() if all(s & ts for s in g.required_traits)}
    return {c for c in cands if ix.root[c[0]] in good_roots and c[1] == ix.root[c[0]]}


def _multiple_providers(ix: _Index, gs: _GroupSearch, cands: set[tuple[int, int, str]]) -> list[_Areq]:
    g = gs.group
    by_tree: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rp, anchor, rc in sorted(cands):
        by_tree[anchor][rc].append(rp)
    out: dict[object, _Areq] = {}
    for anchor, by_rc in by_tree.items():
        classes = sorted(by_rc)
        for combo in itertools.product(*(by_rc[rc] for rc in classes)):
            if any(ix.traits[rp] & g.forbidden_traits for rp in combo):
                continue
            if g.required_traits:
                have: set[str] = set()
                for rp in combo:
                    have |= ix.traits[rp]
                if not all(s & have for s in g.required_traits):
                    continue
            areq = _Areq(
                anchor,
                False,
                tuple((rp, rc, gs.resources[rc]) for rp, rc in zip(combo, classes, strict=True)),
                ((g.suffix, frozenset(combo)),),
            )
            # Per anchor: Placement's set of these ignores the anchor, so a
            # candidate served only by sharing providers keeps one arbitrary
            # anchor there and loses the others' combinations with granular
            # groups. Every anchor is kept here (docs/placement-candidates.md).
            out.setdefault((anchor, areq.key()), areq)
    return list(out.values())


def _same_subtree(ix: _Index, providers: set[int]) -> bool:
    """All providers under one of them."""
    if len(providers) == 1:
        return True
    common: set[int] | None = None
    for rp in providers:
        ancestors = {rp}
        at = ix.parent[rp]
        while at is not None:
            ancestors.add(at)
            at = ix.parent[at]
        common = ancestors if common is None else common & ancestors
    return bool((common or set()) & providers)


def _merge(ix: _Index, query: CandidatesQuery, candidates: dict[str, list[_Areq]]) -> list[_Areq]:
    """One allocation request per combination of one candidate per group on
    the same anchor (Placement's _merge_candidates)."""
    if len(candidates) == 1:
        # One group: every candidate already fits alone and nothing folds.
        # Copies differ only by anchor and share their tuples, in one order.
        only: dict[object, _Areq] = {}
        for areq in next(iter(candidates.values())):
            only.setdefault((areq.requests, areq.mappings), areq)
        return list(only.values())
    suffixes = set(candidates)
    granular = len(suffixes - {""})
    by_anchor: dict[int, dict[str, list[_Areq]]] = defaultdict(lambda: defaultdict(list))
    for suffix, areqs in candidates.items():
        for areq in areqs:
            by_anchor[areq.anchor][suffix].append(areq)
    out: dict[object, _Areq] = {}
    for anchor, lists in by_anchor.items():
        if set(lists) != suffixes:
            continue
        for combo in itertools.product(*lists.values()):
            if query.group_policy == "isolate":
                used = set().union(*(next(iter(a.mappings))[1] for a in combo if a.same_provider))
                if len(used) != granular:
                    continue
            mappings: dict[str, set[int]] = defaultdict(set)
            for a in combo:
                for s, ps in a.mappings:
                    mappings[s] |= ps
            if not all(
                _same_subtree(ix, set().union(*(mappings.get(s, set()) for s in subtree)))
                for subtree in query.same_subtrees
            ):
                continue
            amounts: dict[tuple[int, str], int] = {}
            for a in combo:
                for rp, rc, amount in a.requests:
                    amounts[(rp, rc)] = amounts.get((rp, rc), 0) + amount
            if any(
                ix.summary_resources[rp][rc][1] + amount > ix.summary_resources[rp][rc][0]
                or amount > ix.max_units[rp][rc]
                for (rp, rc), amount in amounts.items()
            ):
                continue
            merged = _Areq(
                anchor,
                False,
                tuple((rp, rc, amount) for (rp, rc), amount in amounts.items()),
                tuple((s, frozenset(ps)) for s, ps in mappings.items()),
            )
            out.setdefault(merged.key(), merged)
    return list(out.values())


def find_candidates(
    graph: ProviderGraph,
    query: CandidatesQuery,
    *,
    resource_classes: Collection[str] | None = None,
    traits: Collection[str] | None = None,
) -> CandidatesAnswer:
    """Placement's answer to `query` over `graph`. `resource_classes` and
    `traits` are the names Placement knows (standard and custom): a query
    naming another is refused as Placement refuses it; None knows every name."""
    ix = _index(graph)
    empty = CandidatesAnswer((), (), query.requested_classes)
    try:
        areqs = _search(ix, query, resource_classes, traits)
    except _NoProviders:
        return empty
    if not areqs:
        return empty
    if isinstance(areqs[0], int):
        return _single_answer(ix, query, areqs)
    full = [a for a in areqs if isinstance(a, _Areq)]
    roots = {ix.root[rp] for a in full for rp, _, _ in a.requests}
    shown = [p for r in sorted(roots) for p in ix.trees[r]]
    if not query.nested_aware and ix.has_trees:
        # Before 1.29 a client cannot place one request on two providers of
        # a tree; the summaries then show only the providers still in play.
        kept = []
        for a in full:
            rps = {rp for rp, _, _ in a.requests}
            if len(rps) == len({ix.root[rp] for rp in rps}):
                kept.append(a)
        full = kept
        shown = sorted({rp for a in full for rp, _, _ in a.requests})
    if query.limit and query.limit < len(full):
        full = full[: query.limit]
        roots = {ix.root[rp] for a in full for rp, _, _ in a.requests}
        shown = [p for p in shown if ix.root[p] in roots]
    return CandidatesAnswer(
        tuple(_allocation_request(ix, a) for a in full),
        tuple(_summary(ix, p) for p in shown),
        query.requested_classes,
    )


def _single_answer(ix: _Index, query: CandidatesQuery, rps: list[int]) -> CandidatesAnswer:
    """The answer when each candidate is one provider (the same steps as
    above, without the merge's objects)."""
    group = query.groups[0]
    resources = dict(group.resources)
    trees = ix.has_trees
    if not resources:
        shown: list[int] = []
    elif not query.nested_aware and trees:
        shown = sorted(set(rps))
    elif query.limit and query.limit < len(rps):
        # Only the trees of the kept candidates are shown: found from those.
        shown = []
    else:
        shown = [p for r in sorted({ix.root[rp] for rp in rps}) for p in ix.trees[r]]
    if query.limit and query.limit < len(rps):
        rps = rps[: query.limit]
        roots = {ix.root[rp] for rp in rps} if resources else set()
        if shown or not resources or (not query.nested_aware and trees):
            shown = [p for p in shown if ix.root[p] in roots]
        else:
            shown = [p for r in sorted(roots) for p in ix.trees[r]]
    uuids, suffix = ix.uuids, group.suffix
    key = (group.resources, suffix)
    made = ix.single_requests.get(key)
    if made is None:
        if len(ix.single_requests) >= SINGLE_REQUEST_SHAPES:
            ix.single_requests.clear()
        made = ix.single_requests[key] = [None] * len(uuids)
    requests: list[AllocationRequest] = []
    for rp in rps:
        ar = made[rp]
        if ar is None:
            ar = made[rp] = AllocationRequest({uuids[rp]: resources} if resources else {},
                                              {suffix: (uuids[rp],)})
        requests.append(ar)
    return CandidatesAnswer(
        tuple(requests),
        tuple(_summary(ix, p) for p in shown),
        query.requested_classes,
    )


def _search(
    ix: _Index, query: CandidatesQuery, classes: Collection[str] | None, traits: Collection[str] | None
) -> list[_Areq] | list[int]:
    """The allocation requests (or, for one single-provider group, just the
    providers, one request each)."""
    anchors: set[int] | None = None
    if query.root_required or query.root_forbidden:
        _check_known(query.root_required, traits)
        _check_known(query.root_forbidden, traits)
        anchors = {
            r
            for r in ix.roots
            if query.root_required <= ix.traits[r] and not (query.root_forbidden & ix.traits[r])
        }
        if not anchors:
            raise _NoProviders
    sharing = set(ix.sharing)
    if len(query.groups) == 1 and (query.groups[0].use_same_provider or not (sharing or ix.has_trees)):
        # One group, each candidate one provider: the common scheduler query,
        # answered without building a merge for it.
        gs = _GroupSearch(ix, query.groups[0], sharing, classes, traits)
        matches = _single_matches(ix, gs)
        if ix.sharing.isdisjoint(matches):
            if anchors is None:
                return matches
            return [rp for rp in matches if ix.root[rp] in anchors]
        return _merge(ix, query, {gs.group.suffix: _single_provider(ix, gs, anchors)})
    candidates: dict[str, list[_Areq]] = {}
    for group in query.groups:
        gs = _GroupSearch(ix, group, sharing, classes, traits)
        if not group.use_same_provider and (gs.sharing or ix.has_trees):
            flat = {t for any_of in group.required_traits for t in any_of}
            if flat and not ix.with_any(ix.by_trait, flat):
                return []
            areqs = _multiple_providers(ix, gs, _trees_matching_all(ix, gs, anchors))
        else:
            areqs = _single_provider(ix, gs, anchors)
        if not areqs:
            return []
        candidates[group.suffix] = areqs
    return _merge(ix, query, candidates)


def _allocation_request(ix: _Index, a: _Areq) -> AllocationRequest:
    uuids = ix.uuids
    if a.same_provider or (len(a.mappings) == 1 and len(a.mappings[0][1]) == 1):
        # One provider (a granular group, or one that held everything): the
        # common case at scale, built without the general walk.
        suffix, ps = a.mappings[0]
        (only,) = ps
        u = uuids[only]
        return AllocationRequest(
            {u: {rc: amount for _, rc, amount in a.requests}} if a.requests else {}, {suffix: (u,)}
        )
    allocations: dict[str, dict[str, int]] = {}
    for rp, rc, amount in a.requests:
        at = allocations.get(uuids[rp])
        if at is None:
            allocations[uuids[rp]] = {rc: amount}
        else:
            at[rc] = amount
    mappings = {
        s: (uuids[next(iter(ps))],) if len(ps) == 1 else tuple(sorted(uuids[p] for p in ps))
        for s, ps in a.mappings
    }
    return AllocationRequest(allocations, mappings)


def _summary(ix: _Index, p: int) -> ProviderSummary:
    done = ix.summaries.get(p)
    if done is not None:
        return done
    parent = ix.parent[p]
    ix.summaries[p] = done = ProviderSummary(
        uuid=ix.uuids[p],
        parent_uuid=None if parent is None else ix.uuids[parent],
        root_uuid=ix.uuids[ix.root[p]],
        resources=ix.summary_resources[p],
        # Placement lists traits in database order: the standard ones (made
        # at start-up) before custom ones (made later).
        traits=tuple(sorted(ix.traits[p], key=lambda t: (t.startswith("CUSTOM_"), t))),
    )
    return done
