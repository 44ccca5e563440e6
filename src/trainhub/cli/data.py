"""`trainhub data`: tenant datasets (push, ls, show, rm, share, unshare)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from trainhub.cli.session import EXIT_INVALID_INPUT, connect, err, fail, out

app = typer.Typer(
    help="Tenant datasets: versioned, content-addressed, mounted read-only by trials "
    "(spec: data: [{name, version, mount}])."
)

RefArg = Annotated[
    str,
    typer.Argument(
        metavar="NAME[:VERSION]",
        help="A dataset: NAME, NAME:VERSION or TENANT/NAME[:VERSION].",
    ),
]
TenantOpt = Annotated[
    str | None, typer.Option("--tenant", help="The owning tenant, where names collide.")
]


def _split(ref: str) -> tuple[str | None, str, int | None]:
    """NAME[:VERSION] or TENANT/NAME[:VERSION] -> (tenant, name, version)."""
    from trainhub.core.dataset_spec import split_ref, valid_name

    text, _, version = ref.partition(":")
    owner, name = split_ref(text)
    if not valid_name(name) or (owner is not None and not valid_name(owner)):
        raise fail(
            f"{ref!r} is not a dataset name",
            "NAME, NAME:VERSION or TENANT/NAME:VERSION (letters, digits, '-', '_', '.')",
            code=EXIT_INVALID_INPUT,
        )
    if version and not version.isdigit():
        raise fail(f"version {version!r} is not a number", code=EXIT_INVALID_INPUT)
    return owner, name, int(version) if version else None


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


def _size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)


@app.command()
def push(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The dataset's name in the tenant.")],
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="A file or folder; its content is the version.")
    ],
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="The tenant it belongs to (if you have several).")
    ] = None,
) -> None:
    """Upload PATH as the next version of dataset NAME (streamed, checksummed; the same
    content again stores nothing)."""
    from trainhub.client.datasets import plan_archive, push_dataset

    _split(name)
    if not path.exists():
        raise fail(f"{path} does not exist", "give a file or a folder", code=EXIT_INVALID_INPUT)
    err.print(f"reading {path} ...")
    plan = plan_archive(path)
    with (
        connect() as client,
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=err,
            transient=True,
        ) as bar,
    ):
        task = bar.add_task(f"push {name}", total=plan.size_bytes)
        version = push_dataset(
            client, name, path, tenant, lambda n: bar.advance(task, n), plan=plan
        )
    stored = version["stored_bytes"]
    how = f"stored {_size(stored)}" if stored else "content known: nothing uploaded"
    out.print(f"{version['ref']} ({plan.num_files} files, {_size(plan.size_bytes)}; {how})")
    out.print(
        f"mount it with  data: [{{name: {version['dataset']}, version: {version['version']}, "
        f"mount: /data/{version['dataset']}}}]"
    )


@app.command("ls")
def ls(
    as_json: Annotated[bool, typer.Option("--json", help="Every dataset as JSON.")] = False,
) -> None:
    """Datasets of your tenants and those shared with them."""
    from trainhub.client.datasets import list_datasets

    with connect() as client:
        found = list_datasets(client)
    if as_json:
        out.print(json.dumps(found, indent=2))
        return
    table = Table("dataset", "tenant", "versions", "latest", "size", "updated", "shared with")
    for d in found:
        latest: dict[str, Any] = d["latest"] or {}
        table.add_row(
            d["name"],
            d["tenant"],
            str(len(d["versions"])),
            str(latest.get("version", "-")),
            _size(latest["size_bytes"]) if latest else "-",
            _when(latest["created_at"]) if latest else "-",
            ", ".join(d["shared_with"]) or "-",
        )
    out.print(table)


@app.command()
def show(ref: RefArg, tenant: TenantOpt = None) -> None:
    """A dataset's versions (size, content hash, who pushed them), or one version as JSON."""
    from trainhub.client.datasets import get_dataset

    owner, name, version = _split(ref)
    with connect() as client:
        dataset = get_dataset(client, name, owner or tenant)
    if version is not None:
        match = [v for v in dataset["versions"] if v["version"] == version]
        if not match:
            have = ", ".join(str(v["version"]) for v in dataset["versions"]) or "none"
            raise fail(f"dataset {name} has no version {version}", f"its versions: {have}")
        out.print(json.dumps(match[0], indent=2))
        return
    out.print(f"{dataset['tenant']}/{dataset['name']}")
    if dataset["shared_with"]:
        out.print(f"shared with: {', '.join(dataset['shared_with'])}")
    table = Table("version", "created", "by", "size", "sha256")
    for v in dataset["versions"]:
        table.add_row(
            str(v["version"]),
            _when(v["created_at"]),
            v["created_by"],
            _size(v["size_bytes"]),
            v["sha256"][:16],
        )
    out.print(table)


@app.command()
def rm(ref: RefArg, tenant: TenantOpt = None) -> None:
    """Remove a version (NAME:VERSION) or the whole dataset (NAME); members of its tenant."""
    from trainhub.client.datasets import remove_dataset

    owner, name, version = _split(ref)
    with connect() as client:
        removed = remove_dataset(client, name, version, owner or tenant)
    out.print("removed " + (", ".join(removed) or "nothing"))


@app.command()
def share(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A dataset of your tenant.")],
    tenant: Annotated[str, typer.Argument(metavar="TENANT", help="The tenant to share with.")],
    stop: Annotated[bool, typer.Option("--stop", help="Stop sharing (unshare).")] = False,
) -> None:
    """Let TENANT read dataset NAME and mount it in its trials (tenant admins)."""
    from trainhub.client.datasets import share_dataset

    owner, dataset_name, _ = _split(name)
    with connect() as client:
        dataset = share_dataset(client, dataset_name, tenant, not stop, owner)
    shared = ", ".join(dataset["shared_with"]) or "nobody"
    out.print(f"{dataset['tenant']}/{dataset['name']} shared with: {shared}")


@app.command()
def unshare(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A dataset of your tenant.")],
    tenant: Annotated[
        str, typer.Argument(metavar="TENANT", help="The tenant to stop sharing with.")
    ],
) -> None:
    """Stop sharing dataset NAME with TENANT (trials that start later cannot mount it)."""
    share(name, tenant, stop=True)
