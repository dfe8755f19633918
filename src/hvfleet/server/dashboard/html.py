"""The dashboard's HTML: one Jinja2 environment over the templates shipped in
`templates/` (autoescape on for every template, so every value is escaped
unless a template says otherwise), `render` for the page modules, and
`script_json` for the one JSON document a page may embed. The page frame,
form fields with their error messages, tables and capacity bars are macros
(`templates/base.html`, `templates/macros.html`); bars carry their figures as
text, so colour is never the only signal."""

from __future__ import annotations

import json
from functools import cache
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from hvfleet.server.dashboard.session import CSRF_FIELD

# What JSON inside a <script> element must not spell: `</script>` ends the
# element and `<!--` opens a comment that swallows the page's later scripts.
# JSON.parse reads the escapes back as the same characters.
_SCRIPT_UNSAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                                "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_json(doc: Any) -> str:
    """`doc` as JSON for a `<script type="application/json">` element: every
    page embeds its data through this one function."""
    return json.dumps(doc).translate(_SCRIPT_UNSAFE)


def _script_json_filter(doc: Any) -> Markup:
    # Safe inside <script type="application/json">: nothing in it can close the element.
    return Markup(script_json(doc))


def _path(value: object) -> str:
    """A path segment (a host name in a link), percent-encoded."""
    return quote(str(value), safe="")


@cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("hvfleet.server.dashboard", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["script_json"] = _script_json_filter
    env.filters["path"] = _path
    env.filters["pair"] = lambda v: (v, v)  # an option whose value is its text
    env.globals["CSRF_FIELD"] = CSRF_FIELD
    return env


def render(template: str, /, **values: Any) -> str:
    """The named template (under `templates/`) filled with `values`."""
    return environment().get_template(template).render(**values)
