"""`hvfleet token create|list|revoke`: API bearer tokens, on the store directly.

This is how the first admin token is made: whoever can open the store can
already do anything. The token is printed once, alone on stdout (so a script
can capture it); what it is goes to stderr.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer

from hvfleet.cli.common import DEFAULT_MANAGER, StoreOpt, connect
from hvfleet.cli.main import app
from hvfleet.cli.output import emit, print_table
from hvfleet.model.token import token_state
from hvfleet.ops.tokens import TokenQuery, issue
from hvfleet.store.tokens import list_tokens, revoke_token
from hvfleet.views.text import age

token_app = typer.Typer(help="Bearer tokens for the API (hvfleet serve).", no_args_is_help=True)
app.add_typer(token_app, name="token")


class RoleChoice(StrEnum):
    viewer = "viewer"
    operator = "operator"
    scheduler = "scheduler"
    agent = "agent"
    admin = "admin"


class ListOutput(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


@token_app.command("create")
def create(
    role: Annotated[RoleChoice, typer.Option("--role", help="viewer, operator, scheduler, agent or admin.")],
    hypervisor: Annotated[
        str | None, typer.Option("--hypervisor", help="The one hypervisor an agent token speaks for.")
    ] = None,
    ttl: Annotated[str, typer.Option("--ttl", help="Lifetime, e.g. 30d, 12h; 0 or never for none.")] = "30d",
    name: Annotated[
        str | None,
        typer.Option("--name", help="Subject and field manager (default: the role; agents: agent/NAME)."),
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Create a token and print it once; only its hash is stored."""
    query = TokenQuery.from_plain({"role": role.value, "hypervisor": hypervisor, "name": name, "ttl": ttl})
    with connect(store) as s:
        answer = issue(s, query, DEFAULT_MANAGER)
    print(answer.summary(), file=sys.stderr)
    print(answer.token)


@token_app.command("list")
def list_command(
    output: Annotated[ListOutput, typer.Option("-o", "--output")] = ListOutput.table,
    store: StoreOpt = None,
) -> None:
    """List tokens (their ids and what they are; never a secret)."""
    with connect(store) as s:
        tokens = list_tokens(s)
    if output != ListOutput.table:
        emit(tokens, output.value)
        return
    if not tokens:
        print("No tokens found.", file=sys.stderr)
        return
    now = datetime.now(UTC)
    rows = [
        [t.name, t.spec.role, t.spec.subject, t.spec.hypervisor or "-", token_state(t, now),
         t.spec.expires_at.isoformat() if t.spec.expires_at else "never",
         age(t.metadata.creation_timestamp, now)]
        for t in tokens
    ]
    print_table(["ID", "ROLE", "SUBJECT", "HYPERVISOR", "STATE", "EXPIRES", "AGE"], rows)


@token_app.command("revoke")
def revoke(
    token: Annotated[str, typer.Argument(help="The token's id (from token list), or the token.")],
    store: StoreOpt = None,
) -> None:
    """Revoke a token; every server refuses it within about a second."""
    with connect(store) as s:
        record = revoke_token(s, token, DEFAULT_MANAGER)
    print(f"token {record.name} ({record.spec.subject}) revoked")
