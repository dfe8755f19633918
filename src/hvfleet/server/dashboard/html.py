"""Small HTML building blocks of the dashboard's server-rendered pages: the page
frame (headings, navigation, who is logged in, logout), escaped text, tables,
form fields with their error messages, and capacity bars. Every value goes
through `esc`, every JSON embedded in a page through `script_json`; bars
carry their figures as text, so colour is never the only signal."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from hvfleet.server.dashboard.session import CSRF_FIELD
from hvfleet.server.identity import Identity


def esc(value: object) -> str:
    return escape(str(value), quote=True)


# What JSON inside a <script> element must not spell: `</script>` ends the
# element and `<!--` opens a comment that swallows the page's later scripts.
# JSON.parse reads the escapes back as the same characters.
_SCRIPT_UNSAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                                "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_json(doc: Any) -> str:
    """`doc` as JSON for a `<script type="application/json">` element: every
    page embeds its data through this one function."""
    return json.dumps(doc).translate(_SCRIPT_UNSAFE)


def page(title: str, body: str, who: Identity | None = None, csrf: str = "",
         scripts: Sequence[str] = (), current: str = "") -> str:
    nav = ""
    if who is not None:
        here = ' aria-current="page"'
        links = "".join(
            f'<li><a href="{href}"{here if key == current else ""}>{label}</a></li>'
            for key, href, label in (("overview", "/", "Overview"), ("history", "/history", "History"),
                                     ("fit", "/fit", "Fit"), ("guests", "/guests", "Guests")))
        nav = (f'<nav aria-label="Dashboard"><ul>{links}</ul></nav>'
               f'<p class="who">Logged in as <strong>{esc(who.subject)}</strong> '
               f'(role <span data-role>{esc(who.role)}</span>)</p>'
               f'<form method="post" action="/logout" class="logout">{csrf_field(csrf)}'
               f'<button type="submit">Log out</button></form>')
    js = "".join(f'<script src="/static/{esc(s)}" defer></script>' for s in scripts)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)} · hvfleet</title><link rel="icon" href="data:,">'
            f'<link rel="stylesheet" href="/static/dashboard.css">{js}</head><body>'
            f'<a class="skip" href="#main">Skip to content</a>'
            f'<header><p class="brand">hvfleet</p>{nav}</header>'
            f'<main id="main" tabindex="-1">{body}</main></body></html>')


def csrf_field(csrf: str) -> str:
    return f'<input type="hidden" name="{CSRF_FIELD}" value="{esc(csrf)}">'


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "",
          raw: bool = False, cls: str = "") -> str:
    """A table; cells are escaped unless `raw` (then the caller built them)."""
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if raw else esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def field(name: str, label: str, value: str = "", errors: Mapping[str, str] | None = None,
          kind: str = "text", hint: str = "", form: str = "", options: Sequence[tuple[str, str]] = (),
          required: bool = False) -> str:
    """A labelled input; its error (if any) right below it, tied by aria-describedby."""
    ident = f"{form}-{name}" if form else name
    error = (errors or {}).get(name)
    described = []
    extra = ""
    if hint:
        described.append(f"{ident}-hint")
        extra += f'<span class="hint" id="{ident}-hint">{esc(hint)}</span>'
    if error:
        described.append(f"{ident}-error")
        extra += f'<span class="error" id="{ident}-error" role="alert">Error: {esc(error)}</span>'
    attrs = f'id="{ident}" name="{esc(name)}"'
    if described:
        attrs += f' aria-describedby="{" ".join(described)}"'
    if error:
        attrs += ' aria-invalid="true"'
    if required:
        attrs += " required"
    if kind == "select":
        opts = "".join(f'<option value="{esc(v)}"{" selected" if v == value else ""}>{esc(t)}</option>'
                       for v, t in options)
        control = f"<select {attrs}>{opts}</select>"
    elif kind == "textarea":
        control = f'<textarea {attrs} rows="12" cols="80">{esc(value)}</textarea>'
    else:
        control = f'<input type="{kind}" {attrs} value="{esc(value)}">'
    return f'<div class="field"><label for="{ident}">{esc(label)}</label>{control}{extra}</div>'


def bar(resource: str, x: Mapping[str, Any]) -> str:
    """One resource's bar from a feed entry (feed.host_row): allocated, held by
    reservations, free, up to effective; the raw-capacity mark; the text."""
    b, t = x["bar"], x["text"]
    ratio = x.get("ratio")
    words = (f"{resource}: {t['allocation']} allocated, {t['held']} held by reservations, "
             f"{t['free']} free of {t['effective']} effective")
    if "raw" in t and x.get("raw") is not None:
        words += f"; raw capacity {t['raw']}, overcommit ×{ratio:g}"
    level = x.get("level", "ok")
    segs = (f'<span class="seg alloc" style="width:{b["allocation"] * 100:.2f}%"></span>'
            f'<span class="seg held" style="width:{b["held"] * 100:.2f}%"></span>'
            f'<span class="seg free" style="width:{b["free"] * 100:.2f}%"></span>'
            f'<span class="mark eff" style="left:{b["effective"] * 100:.2f}%"></span>')
    if x.get("raw") is not None:
        segs += f'<span class="mark raw" style="left:{b["raw"] * 100:.2f}%"></span>'
    note = ' <strong class="over">overcommitted</strong>' if level == "overcommitted" else (
        ' <em class="low">low</em>' if level == "low" else "")
    ratio_text = f' <span class="ratio">×{ratio:g}</span>' if ratio is not None and ratio != 1 else ""
    return (f'<div class="res level-{esc(level)}"><span class="rname">{esc(resource)}</span>'
            f'<span class="bar" role="img" aria-label="{esc(words)}">{segs}</span>'
            f'<span class="btext">{esc(t["allocation"])} + {esc(t["held"])} held / '
            f'{esc(t["effective"])}, free {esc(t["free"])}{ratio_text}{note}</span></div>')
