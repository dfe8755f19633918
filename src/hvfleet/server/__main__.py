"""`python -m hvfleet.server SETTINGS`: the server program `hvfleet serve` becomes.

SETTINGS is one JSON object with the fields of `ServeOptions` (the CLI parses
the flags; see hvfleet.cli.serve). Errors are one line on stderr and the
error's exit code, as everywhere in hvfleet (bad settings → 2).
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from hvfleet.model.errors import HvfleetError, InvalidInput
from hvfleet.server.serve import ServeOptions, serve


def options_from_json(text: str) -> ServeOptions:
    try:
        doc = json.loads(text)
    except ValueError:
        raise InvalidInput("settings: not a JSON object") from None
    if not isinstance(doc, dict):
        raise InvalidInput("settings: not a JSON object")
    known = {f.name for f in fields(ServeOptions)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise InvalidInput(f"settings: unknown field {unknown[0]!r}")
    values: dict[str, Any] = {k: v for k, v in doc.items() if v is not None}
    if "data_dir" in values:
        values["data_dir"] = Path(values["data_dir"])
    if "tls_names" in values:
        names = values["tls_names"]
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise InvalidInput("settings: tls_names must be a list of names")
        values["tls_names"] = tuple(names)
    return ServeOptions(**values)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 1:
            raise InvalidInput("settings: expected one JSON argument (run `hvfleet serve`)")
        serve(options_from_json(args[0]))
    except HvfleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
