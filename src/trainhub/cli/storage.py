"""`trainhub storage`: move the artifact store (a folder) into a bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="The artifact store (docs/storage.md).")


@app.command("migrate")
def migrate(
    to: Annotated[str, typer.Option("--to", help="The new store: s3://BUCKET/PREFIX.")],
    source: Annotated[
        Path | None,
        typer.Option(
            "--from",
            envvar="TRAINHUB_STORAGE",
            help="The folder the server stores in now; default: HOME/artifacts.",
        ),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(envvar="TRAINHUB_HOME", help="State directory; default: ~/.trainhub."),
    ] = None,
    s3_endpoint: Annotated[
        str | None,
        typer.Option(envvar="TRAINHUB_S3_ENDPOINT", help="URL of an S3-compatible server."),
    ] = None,
) -> None:
    """Copy every object of the folder store into the bucket, verifying each by SHA-256.

    Run it again until it reports no copy (it skips what is already there), then restart the
    server with `--storage s3://...` (docs/storage.md: the steps for a running cluster).
    """
    from trainhub.adapters.storage import open_artifact_store
    from trainhub.cli.session import fail
    from trainhub.core.errors import StorageUnavailable
    from trainhub.server import default_home
    from trainhub.service.storage_migration import migrate_store

    folder = source or (home or default_home()).expanduser() / "artifacts"
    if not folder.is_dir():
        raise fail(f"no folder store at {folder}", "pass --from with the server's --storage")
    if not to.startswith("s3://"):
        raise fail(f"--to {to!r} is not a bucket", "use s3://BUCKET/PREFIX", code=2)
    try:
        target = open_artifact_store(to, s3_endpoint=s3_endpoint)
    except StorageUnavailable as exc:
        raise fail(exc.message, exc.hint) from None
    report = migrate_store(open_artifact_store(folder), target)
    typer.echo(
        f"copied {report.copied} objects ({report.bytes_copied} bytes), "
        f"{report.skipped} already there, {len(report.mismatched)} failed verification"
    )
    if not report.ok:
        raise fail(
            "these objects did not verify: " + ", ".join(report.mismatched[:20]),
            "run the migration again; stop the server first if they keep changing",
        )
    typer.echo(f"all verified: restart the server with --storage {to}")
