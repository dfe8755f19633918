"""`hvfleet kubeconfig`: a kubeconfig for kubectl and Kubernetes clients.

    hvfleet kubeconfig --server https://127.0.0.1:8443 --token hvf_… [--ca FILE] [-o FILE]

The file holds the token, so `-o` writes it owner-only (0600).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from hvfleet.cli.main import app
from hvfleet.model.errors import InvalidInput
from hvfleet.store.kubeconfig import DEFAULT_NAME, dump_kubeconfig, render_kubeconfig


@app.command("kubeconfig")
def kubeconfig(
    server: Annotated[str, typer.Option("--server", help="The API server, e.g. https://127.0.0.1:8443.")],
    token: Annotated[str, typer.Option("--token", envvar="HVFLEET_TOKEN", help="A bearer token.")],
    ca: Annotated[
        str | None, typer.Option("--ca", help="CA certificate (PEM) to embed, e.g. the one serve printed.")
    ] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="File to write (default stdout).")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="Cluster, user and context name.")] = DEFAULT_NAME,
) -> None:
    """Write a kubeconfig (CA embedded) that kubectl and the Kubernetes clients use as is."""
    ca_pem: bytes | None = None
    if ca is not None:
        try:
            with open(ca, "rb") as f:
                ca_pem = f.read()
        except OSError as exc:
            raise InvalidInput(f"ca: {ca}: cannot read: {exc.strerror}") from None
    text = dump_kubeconfig(render_kubeconfig(server, token, ca_pem, name))
    if output is None:
        sys.stdout.write(text)
        return
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise InvalidInput(f"output: {output}: cannot write: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    print(f"kubeconfig written to {output}", file=sys.stderr)
