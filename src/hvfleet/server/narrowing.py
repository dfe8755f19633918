"""What a narrowed read (`hvfleet.server.identity.Selecting`) may serve.

An agent reads the OvercommitPolicies that select its own hypervisor, and no
other (hvfleet.server.auth grants it so): `view_of` reads that host's labels
as they are now and answers which objects the caller may see, with Table
inputs that show nothing of the rest of the fleet. Only objects that select
hosts (OvercommitPolicy: its `KindStrategy.selects_host`, hvfleet.model.kinds)
can be visible; of any other kind, none. A host not created yet has no labels, so
it sees the policies whose selector is empty (they select every host).
The handlers apply the view to a list, to each event of a watch (entering it
is ADDED, leaving it DELETED, `hvfleet.server.watch.seen_through`) and to a get,
where an object outside it, or one that does not exist, is Forbidden alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hvfleet.model.errors import NotFound
from hvfleet.model.hypervisor import Resource
from hvfleet.model.kinds import governs
from hvfleet.server.auth import not_selecting
from hvfleet.server.identity import Action, Identity, Selecting
from hvfleet.store.base import Store
from hvfleet.store.undecodable import Undecodable
from hvfleet.views.tables import TableInputs

Visible = Callable[[Resource], bool]


@dataclass(frozen=True)
class View:
    visible: Visible
    # Table rows count hosts a policy selects: only the caller's own is shown.
    table_inputs: TableInputs


def view_of(store: Store, narrowed: Selecting) -> View:
    """The objects `narrowed` lets its caller see, judged by the host's labels now."""
    try:
        host = store.get_hypervisor(narrowed.hypervisor)
    except NotFound:
        return View(lambda obj: governs(obj, {}), TableInputs())
    labels = dict(host.metadata.labels)
    return View(lambda obj: governs(obj, labels),
                TableInputs(hosts={host.name: host}))


def get_visible(store: Store, who: Identity, action: Action, kind: str,
                narrowed: Selecting) -> tuple[Resource, View]:
    """The object a narrowed get names, if the caller may see it; else
    Forbidden, the same whether it exists or not."""
    assert action.name is not None
    view = view_of(store, narrowed)
    try:
        obj = store.get(kind, action.name)
    except (NotFound, Undecodable):  # (whether it could be visible cannot be judged)
        raise not_selecting(who, action, action.name, narrowed) from None
    if not view.visible(obj):
        raise not_selecting(who, action, action.name, narrowed)
    return obj, view
