"""Administration: tenants and their quotas, users and memberships, API tokens, the cluster."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from trainhub.cli.fit import print_fitted
from trainhub.cli.session import connect, fail, out

tenants_app = typer.Typer(
    help="Tenants (teams) and their GPU quotas. Admins only.", no_args_is_help=True
)
users_app = typer.Typer(
    help="Users and their tenant memberships. Admins only.", no_args_is_help=True
)
tokens_app = typer.Typer(help="API tokens: yours, or any user's for admins.", no_args_is_help=True)


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


def _slots(n: int | None) -> str:
    return "none" if n is None else str(n)


# -- tenants --


@tenants_app.command("ls")
def tenants_ls() -> None:
    """List tenants with their guaranteed slots, limit and fair-share weight."""
    with connect() as client:
        rows = client.list_tenants()
    table = Table(show_edge=False)
    table.add_column("tenant")
    table.add_column("guaranteed slots", justify="right")
    table.add_column("limit", justify="right")
    table.add_column("weight", justify="right")
    for t in rows:
        table.add_row(
            Text(t["name"]),
            str(t["guaranteed_slots"]),
            _slots(t["limit_slots"]),
            f"{t['weight']:g}",
        )
    print_fitted(table, out)


@tenants_app.command("create")
def tenants_create(
    name: str,
    guaranteed: Annotated[
        int, typer.Option(min=0, help="Slots (GPUs) the tenant can always get.")
    ] = 0,
    limit: Annotated[
        int | None, typer.Option(min=0, help="Most slots it may hold; default: no limit.")
    ] = None,
    weight: Annotated[float, typer.Option(min=0.0, help="Share of spare capacity.")] = 1.0,
) -> None:
    """Create a tenant."""
    with connect() as client:
        t = client.create_tenant(name, guaranteed, limit, weight)
    out.print(
        f"created tenant {escape(t['name'])}: guaranteed {t['guaranteed_slots']} slots, "
        f"limit {_slots(t['limit_slots'])}, weight {t['weight']:g}"
    )


@tenants_app.command("update")
def tenants_update(
    name: str,
    guaranteed: Annotated[int | None, typer.Option(min=0)] = None,
    limit: Annotated[int | None, typer.Option(min=0)] = None,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="Remove the limit.")] = False,
    weight: Annotated[float | None, typer.Option(min=0.0)] = None,
    checkpoint_gb: Annotated[
        float | None, typer.Option(min=0.001, help="Largest checkpoint file, in GB.")
    ] = None,
    trial_storage_gb: Annotated[
        float | None,
        typer.Option(min=0.001, help="Checkpoints and node folders one trial keeps, in GB."),
    ] = None,
    storage_gb: Annotated[
        float | None,
        typer.Option(min=0.001, help="Checkpoints and node folders the tenant keeps, in GB."),
    ] = None,
    default_storage: Annotated[
        bool, typer.Option("--default-storage", help="Storage quotas back to the defaults.")
    ] = False,
) -> None:
    """Change a tenant's quotas; options left out stay as they are."""
    if no_limit and limit is not None:
        raise fail("give --limit or --no-limit, not both", code=2)
    with connect() as client:
        t = client.update_tenant(
            name,
            guaranteed,
            limit,
            weight,
            clear_limit=no_limit,
            max_checkpoint_bytes=_bytes(checkpoint_gb),
            max_trial_storage_bytes=_bytes(trial_storage_gb),
            max_storage_bytes=_bytes(storage_gb),
            clear_storage_quotas=default_storage,
        )
    out.print(
        f"tenant {escape(t['name'])}: guaranteed {t['guaranteed_slots']} slots, "
        f"limit {_slots(t['limit_slots'])}, weight {t['weight']:g}; storage: checkpoint "
        f"{_gb(t['max_checkpoint_bytes'])}, trial {_gb(t['max_trial_storage_bytes'])}, "
        f"tenant {_gb(t['max_storage_bytes'])}"
    )


def _bytes(gb: float | None) -> int | None:
    return None if gb is None else round(gb * 1e9)


def _gb(size: int) -> str:
    from trainhub.cli.context import human_bytes

    return human_bytes(size)


# -- users --


@users_app.command("ls")
def users_ls() -> None:
    """List users with their roles per tenant."""
    with connect() as client:
        rows = client.list_users()
    table = Table(show_edge=False)
    table.add_column("id", justify="right")
    table.add_column("user")
    table.add_column("cluster admin")
    table.add_column("active")
    table.add_column("tenants (role)")
    for u in rows:
        roles = ", ".join(f"{t} ({r})" for t, r in sorted(u["roles"].items()))
        table.add_row(
            str(u["id"]),
            Text(u["username"]),
            "yes" if u["is_admin"] else "",
            "yes" if u["active"] else "no",
            Text(roles),
        )
    print_fitted(table, out)


@users_app.command("create")
def users_create(
    name: str,
    admin: Annotated[bool, typer.Option("--admin", help="Make a cluster admin.")] = False,
) -> None:
    """Create a user (then add them to a tenant and create a token for them)."""
    with connect() as client:
        u = client.create_user(name, admin)
    kind = "cluster admin" if u["is_admin"] else "user"
    out.print(f"created {kind} {escape(u['username'])} (id {u['id']})")
    out.print(
        f"[dim]next: trainhub users add-to TENANT {escape(name)} --role member; "
        f"trainhub tokens create --user {escape(name)}[/]"
    )


_MEMBERSHIP_ORDER = "the tenant comes first, then the user: trainhub users {verb} TENANT USER"


@contextmanager
def _membership_hint(verb: str) -> Iterator[None]:
    """A name that does not exist, said with the argument order (easy to swap)."""
    from trainhub.client import ApiError

    try:
        yield
    except ApiError as exc:
        if exc.status_code != 404 or exc.hint:
            raise
        hint = _MEMBERSHIP_ORDER.format(verb=verb)
        raise ApiError(exc.status_code, exc.code, exc.message, hint, exc.errors) from None


@users_app.command("add-to")
def users_add_to(
    tenant: Annotated[str, typer.Argument(help="The tenant (first).")],
    name: Annotated[str, typer.Argument(help="The user to add (second).")],
    role: Annotated[Role, typer.Option(case_sensitive=False)] = Role.MEMBER,
) -> None:
    """Add a user to a tenant, or change their role there: add-to TENANT USER."""
    with connect() as client, _membership_hint("add-to"):
        u = client.set_membership(name, tenant, role.value)
    now_role = u["roles"].get(tenant, role.value)
    out.print(f"{escape(u['username'])} is {escape(now_role)} of {escape(tenant)}")


@users_app.command("remove-from")
def users_remove_from(
    tenant: Annotated[str, typer.Argument(help="The tenant (first).")],
    name: Annotated[str, typer.Argument(help="The user to remove (second).")],
) -> None:
    """Remove a user from a tenant: remove-from TENANT USER."""
    with connect() as client, _membership_hint("remove-from"):
        client.remove_membership(name, tenant)
    out.print(f"removed {escape(name)} from {escape(tenant)}")


# -- tokens --


@tokens_app.command("ls")
def tokens_ls() -> None:
    """List API tokens (never their secrets)."""
    from trainhub.cli.render import ago, local_time

    with connect() as client:
        rows = client.list_tokens()
    table = Table(show_edge=False)
    table.add_column("id", justify="right")
    table.add_column("prefix")
    table.add_column("name")
    table.add_column("created")
    table.add_column("expires")
    table.add_column("last used")
    table.add_column("state")
    for t in rows:
        table.add_row(
            str(t["id"]),
            Text(t["prefix"]),
            Text(t["name"]),
            local_time(t["created_at"]),
            local_time(t["expires_at"]) if t["expires_at"] else "never",
            ago(t["last_used_at"]),
            Text("revoked", style="red") if t["revoked"] else Text("active", style="green"),
        )
    print_fitted(table, out)


@tokens_app.command("create")
def tokens_create(
    name: Annotated[str, typer.Option(help="A label, e.g. 'laptop' or 'ci'.")] = "",
    user: Annotated[str | None, typer.Option(help="Admins: issue the token for this user.")] = None,
    ttl_s: Annotated[
        float | None, typer.Option("--ttl-s", min=1.0, help="Seconds until it expires.")
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the secret (for scripts).")
    ] = False,
) -> None:
    """Create an API token and print its secret, this one time only."""
    from trainhub.cli.render import local_time

    with connect() as client:
        t = client.create_token(name, user, ttl_s)
        url = client.url
    if quiet:
        print(t["token"])
        return
    expires = local_time(t["expires_at"]) if t["expires_at"] else "never"
    who = f" for {escape(user)}" if user else ""
    out.print(f"created token {t['id']}{who} (prefix {escape(t['prefix'])}, expires {expires}).")
    out.print("[bold]The secret is shown only this once; store it now:[/]\n")
    out.print(Text(f"    {t['token']}\n"))
    out.print(f"[dim]use it with: trainhub login --url {escape(url)} --token SECRET[/]")


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[int, typer.Argument(metavar="ID")]) -> None:
    """Revoke a token; requests with it fail from now on."""
    with connect() as client:
        client.revoke_token(token_id)
    out.print(f"revoked token {token_id}")


# -- cluster --


def _memory(node: dict[str, Any]) -> str:
    """What trials may reserve (Ray's ``memory`` resource) / the host's total (its agent)."""
    reservable, host = node.get("total_memory_gb"), node.get("host_memory_gb")
    text = "-" if reservable is None else f"{reservable:.1f}"
    return text if host is None else f"{text} / {host:.1f}"


def cluster() -> None:
    """Show the cluster's nodes and their resources."""
    with connect() as client:
        c = client.cluster()
    for warning in c.get("warnings", []):
        out.print(Text(f"WARNING: {warning}", style="bold red"))
    if not c["nodes"]:
        out.print("the cluster has no nodes yet (is Ray running?)")
        return
    table = Table(show_edge=False)
    table.add_column("node")
    table.add_column("alive")
    table.add_column("GPUs", justify="right")
    table.add_column("GPU model")
    table.add_column("CPUs", justify="right")
    table.add_column("memory GB\nfor trials/host", justify="right")  # as `trainhub nodes`
    table.add_column("labels")
    for n in c["nodes"]:
        table.add_row(
            Text(n.get("hostname") or n["node_id"][:12]),
            Text("yes", style="green") if n["alive"] else Text("no", style="red"),
            str(n["total_gpus"]),
            Text(n["gpu_model"] or "-"),
            f"{n['total_cpus']:g}",
            _memory(n),
            Text(", ".join(f"{k}={v}" for k, v in sorted(n["labels"].items()))),
        )
    print_fitted(table, out)
    alive = sum(1 for n in c["nodes"] if n["alive"])
    out.print(
        f"{alive}/{len(c['nodes'])} nodes alive, {c['total_gpus']} GPUs, {c['total_cpus']:g} CPUs, "
        f"trials sandboxed: {c.get('sandbox', 'none')}"
    )
