"""Placement's policy defaults mapped onto hvfleet roles: THE table of which
role may follow which Placement rule (docs/security.md renders it).

- admin: everything;
- scheduler: read, allocation candidates, allocations (what Nova's scheduler
  and conductor do);
- operator: read, and providers, inventories, traits, aggregates and custom
  resource classes and traits (what an operator's tooling does), not
  allocations;
- agent: its own provider tree only (the providers whose root is its
  hypervisor): read them, write their inventories and traits (what Nova's
  compute service does for its node);
- viewer: what Placement's defaults let a reader do: the usages of a
  project (`GET /usages`; Placement's reader reads its own project's, an
  hvfleet viewer has no project and reads any). Every other Placement rule is
  admin-or-service in Placement 16.0, so a viewer gets its 403."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hvfleet.placement.errors import PlacementForbidden

if TYPE_CHECKING:
    from hvfleet.server.identity import Identity
    from hvfleet.server.placement.edge import Call

# Rules: "read" (any GET but the two below), "names" (GET of resource classes
# and traits), "usages" (GET /usages: a project's usages), "candidates",
# "allocations", "providers", "inventories", "traits", "aggregates",
# "resource_classes", "trait_names", "reshaper".
ROLE_RULES: dict[str, frozenset[str]] = {
    "admin": frozenset({"read", "names", "usages", "candidates", "allocations", "providers",
                        "inventories", "traits", "aggregates", "resource_classes", "trait_names",
                        "reshaper"}),
    "scheduler": frozenset({"read", "names", "usages", "candidates", "allocations"}),
    "operator": frozenset({"read", "names", "usages", "providers", "inventories", "traits",
                           "aggregates", "resource_classes", "trait_names"}),
    "viewer": frozenset({"usages"}),
    "agent": frozenset(),
}
# What an agent may do on the providers of its own tree.
AGENT_OWN = frozenset({"read", "inventories", "traits"})


def allowed_by_role(who: Identity, rule: str) -> bool:
    """Whether the role alone allows `rule` (no lookup: the edge asks this
    on the event loop, and calls `authorize` in a thread only when not)."""
    # "open": no token needed; "authenticated": any valid token (the 404s and 405s of routing).
    return rule in ("open", "authenticated") or rule in ROLE_RULES.get(who.role, frozenset())


def authorize(call: Call, rule: str) -> None:
    who = call.who
    if allowed_by_role(who, rule):
        return
    if who.role == "agent" and rule in AGENT_OWN and who.hypervisor and "uuid" in call.request.path_params:
        p = call.source().fleet().providers.get(call.path("uuid"))
        mine = call.snapshot(catch_up=False).host_provider(who.hypervisor)
        if p is not None and mine is not None and p.root_uuid == mine:
            return
    raise PlacementForbidden(
        f"Policy does not allow placement:{rule} to be performed. (role {who.role}"
        + (f", bound to hypervisor {who.hypervisor}" if who.hypervisor else "") + ")",
    )


def rules_markdown() -> str:
    roles = ["viewer", "operator", "scheduler", "agent", "admin"]
    rules = ["read", "names", "usages", "candidates", "allocations", "providers", "inventories", "traits",
             "aggregates", "resource_classes", "trait_names", "reshaper"]
    lines = ["| Placement rule | " + " | ".join(roles) + " |", "|---" * (len(roles) + 1) + "|"]
    for rule in rules:
        cells = []
        for role in roles:
            if rule in ROLE_RULES[role]:
                cells.append("yes")
            elif role == "agent" and rule in AGENT_OWN:
                cells.append("own tree")
            else:
                cells.append("—")
        lines.append(f"| `{rule}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
