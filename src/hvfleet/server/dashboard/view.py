"""What an overview shows, read from its URL in one place: the label
selector, a name search (prefix or substring), the states to show, the sort
and its direction, the page and its size, and the label the heat map is
grouped by; and the rows that view selects, in its order. The overview's
page, its JSON feed and the heat map all read the view through `View.of`, so
a shared URL shows the same hosts in the same order everywhere."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hvfleet.model.errors import InvalidInput
from hvfleet.model.resources import ResourceName
from hvfleet.model.selectors import Selector, parse_selector
from hvfleet.server.dashboard.feed import HostRow, sort_rows

PER_PAGE = 100
MAX_PER_PAGE = 1000
PAGE_SIZES = (25, 50, 100, 250, 500, 1000)
# The states a person filters by: readiness, and SYNCED False as its own.
STATES = ("Ready", "NotReady", "Stale", "Unknown", "Maintenance", "NotSynced")
STATE_LABELS = {"NotSynced": "SYNCED False"}
# Sorting by state puts the hosts that need a look first.
_STATE_RANK = {"NotReady": 0, "Stale": 1, "Unknown": 2, "Maintenance": 3, "Ready": 4}
_MAX_QUERY = 253  # a host name is at most this long


def state_of(x: HostRow) -> str:
    rd = x.doc.get("readiness") or {}
    return str(rd.get("state", "Unknown"))


def not_synced(x: HostRow) -> bool:
    return bool((x.doc.get("synced") or {}).get("state") == "False")


@dataclass(frozen=True)
class View:
    selector_text: str = ""
    query: str = ""
    states: tuple[str, ...] = ()
    sort: str = "name"
    descending: bool = False
    page: int = 1
    per_page: int = PER_PAGE
    group: str = ""

    @property
    def selector(self) -> Selector:
        return parse_selector(self.selector_text)

    @staticmethod
    def of(params: Mapping[str, str], ints: Callable[[str, int, int], int]) -> View:
        """The view of a query string (`ints(name, default, high)` reads a
        whole number, refusing a bad one naming the parameter). A bad value is
        InvalidInput naming its parameter."""
        selector_text = params.get("selector", "")
        parse_selector(selector_text)  # refused here, naming the selector
        query = params.get("q", "").strip()
        if len(query) > _MAX_QUERY:
            raise InvalidInput(f"a host name is at most {_MAX_QUERY} characters", field="q")
        states = tuple(s for s in (p.strip() for p in params.get("state", "").split(",")) if s)
        for s in states:
            if s not in STATES:
                raise InvalidInput(f"state {s!r} is not one of {', '.join(STATES)}", field="state")
        sort = params.get("sort", "") or "name"
        how, _, resource = sort.partition(":")
        if how in ("free", "used") and resource:
            ResourceName.parse(resource, where="sort")
        elif sort not in ("name", "state", "instances"):
            raise InvalidInput(f"sort {sort!r} is not name, state, instances, free:RESOURCE or "
                               "used:RESOURCE", field="sort")
        order = params.get("order", "") or "asc"
        if order not in ("asc", "desc"):
            raise InvalidInput(f"order {order!r} is not asc or desc", field="order")
        group = params.get("group", "").strip()
        if group:
            parse_selector(group)  # a label key is a selector of its existence
        return View(selector_text, query, states, sort, order == "desc", ints("page", 1, 10**9),
                    ints("perPage", PER_PAGE, MAX_PER_PAGE), group)

    def params(self, **changes: Any) -> dict[str, str]:
        """The view as query parameters (only what differs from the default)."""
        v = {"selector": self.selector_text, "q": self.query, "state": ",".join(self.states),
             "sort": self.sort if self.sort != "name" else "", "order": "desc" if self.descending else "",
             "page": str(self.page) if self.page != 1 else "",
             "perPage": str(self.per_page) if self.per_page != PER_PAGE else "", "group": self.group}
        v.update({k: str(x) for k, x in changes.items()})
        return {k: x for k, x in v.items() if x}

    def rows(self, rows: list[HostRow]) -> list[HostRow]:
        """`rows` (the selector's, in name order) narrowed by the search and
        the states, in this view's order."""
        if self.query:
            q = self.query.lower()
            prefix = [x for x in rows if x.name.lower().startswith(q)]
            rest = [x for x in rows if q in x.name.lower() and not x.name.lower().startswith(q)]
            rows = prefix + rest  # names that start with it first, then those containing it
        if self.states:
            wanted = set(self.states)
            rows = [x for x in rows if state_of(x) in wanted or ("NotSynced" in wanted and not_synced(x))]
        ordered = self._ordered(rows)
        return ordered[::-1] if self.descending else ordered

    def _ordered(self, rows: list[HostRow]) -> list[HostRow]:
        if self.sort == "name":
            return rows
        if self.sort == "state":
            return sorted(rows, key=lambda x: _STATE_RANK.get(state_of(x), 2))
        if self.sort == "instances":
            return sorted(rows, key=lambda x: -int(x.doc.get("instances", 0)))
        return sort_rows(rows, self.sort)
