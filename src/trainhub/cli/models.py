"""`trainhub models`: the model registry (register, ls, show, download, share, suggest, export)
and `trainhub compress`."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from trainhub.cli.fit import print_fitted
from trainhub.cli.session import EXIT_INVALID_INPUT, connect, fail, out

app = typer.Typer(help="The model registry: versioned models made from trials' checkpoints.")

RefArg = Annotated[
    str,
    typer.Argument(
        metavar="NAME[:VERSION]",
        help="A model: NAME (its latest version), NAME:VERSION or TENANT/NAME:VERSION.",
    ),
]
TenantOpt = Annotated[
    str | None, typer.Option("--tenant", help="The owning tenant, where names collide.")
]


def _split(ref: str) -> tuple[str | None, str, int | None]:
    """NAME[:VERSION] or TENANT/NAME[:VERSION] -> (tenant, name, version)."""
    from trainhub.core.model_spec import parse_model_ref

    try:
        parsed = parse_model_ref(ref)
    except ValueError as exc:
        raise fail(str(exc), code=EXIT_INVALID_INPUT) from None
    if parsed.name is None:
        raise fail(f"{ref!r} names a trial, not a model", code=EXIT_INVALID_INPUT)
    return parsed.tenant, parsed.name, parsed.version


def _version_of(client: Any, ref: str, tenant: str | None) -> dict[str, Any]:
    owner, name, version = _split(ref)
    model = client.get_model(name, owner or tenant)
    if version is None:
        if model["latest"] is None:
            raise fail(f"model {name} has no version", code=EXIT_INVALID_INPUT)
        found: dict[str, Any] = model["latest"]
        return found
    found = client.get_model_version(name, version, model["tenant"])
    return found


def _parse_arch(text: str) -> dict[str, Any]:
    example = '--arch \'{"zoo": "lenet5", "args": {"num_classes": 10}, "input": [1, 28, 28]}\''
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise fail(f"--arch is not JSON: {exc}", example, code=EXIT_INVALID_INPUT) from None
    if not isinstance(value, dict):
        raise fail("--arch must be a JSON object", example, code=EXIT_INVALID_INPUT)
    return value


def _write(target: Path, data: bytes) -> None:
    try:
        target.write_bytes(data)
    except OSError as exc:
        raise fail(
            f"cannot write {target}: {exc.strerror or exc}",
            "pass -o FILE in a writable directory",
            code=EXIT_INVALID_INPUT,
        ) from None


def _target(output: Path | None, version: dict[str, Any], suffix: str) -> Path:
    """``output``, a file named for the version in it when it is a directory, or in ``.``."""
    name = f"{version['model']}-v{version['version']}.{suffix}"
    if output is None:
        return Path(name)
    return output / name if output.is_dir() else output


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


def _metrics(metrics: dict[str, Any], limit: int = 4) -> str:
    shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()]
    return ", ".join(shown[:limit]) + (", ..." if len(shown) > limit else "")


@app.command()
def register(
    trial_id: Annotated[
        int, typer.Argument(metavar="TRIAL", help="The trial whose checkpoint is registered.")
    ],
    name: Annotated[str, typer.Option("--name", "-n", help="The model's name in the tenant.")],
    checkpoint: Annotated[
        int | None, typer.Option("--checkpoint", help="A checkpoint id; default: the latest.")
    ] = None,
    description: Annotated[
        str, typer.Option("--description", "-d", help="What this version is, in words.")
    ] = "",
    arch: Annotated[
        str | None,
        typer.Option(
            "--arch", help='JSON {"zoo", "args", "input"}; default: the spec\'s model.arch'
        ),
    ] = None,
) -> None:
    """Register a checkpoint of TRIAL as the next version of model NAME."""
    arch_value = _parse_arch(arch) if arch else None
    with connect() as client:
        version = client.register_model(
            trial_id, name, checkpoint, description=description, arch=arch_value
        )
    from trainhub.cli.context import human_bytes

    out.print(f"registered {version['ref']} ({human_bytes(version['size_bytes'])})")
    out.print(f"start from it with  model: {{init_from: {version['ref']}}}")


@app.command("ls")
def ls(
    as_json: Annotated[
        bool, typer.Option("--json", help="Every model and version as JSON.")
    ] = False,
) -> None:
    """Models of your tenants and those shared with them."""
    with connect() as client:
        models = client.list_models()
    if as_json:
        out.print(json.dumps(models, indent=2))
        return
    table = Table("model", "tenant", "versions", "latest", "metrics", "shared with")
    for m in models:
        latest = m["latest"] or {}
        table.add_row(
            m["name"],
            m["tenant"],
            str(len(m["versions"])),
            _when(latest["created_at"]) if latest else "-",
            _metrics(latest.get("metrics") or {}),
            ", ".join(m["shared_with"]) or "-",
        )
    print_fitted(table, out)


@app.command()
def show(
    ref: RefArg,
    tenant: TenantOpt = None,
) -> None:
    """A model's versions, or one version's architecture, metrics and lineage."""
    owner, name, version = _split(ref)
    with connect() as client:
        if version is not None:
            out.print(
                json.dumps(client.get_model_version(name, version, owner or tenant), indent=2)
            )
            return
        model = client.get_model(name, owner or tenant)
    out.print(f"{model['tenant']}/{model['name']}: {model['description'] or ''}")
    if model["shared_with"]:
        out.print(f"shared with: {', '.join(model['shared_with'])}")
    table = Table("version", "created", "by", "arch", "metrics", "from trial")
    misfits = []
    for v in model["versions"]:
        arch = v["arch"].get("zoo", "-") if v["arch"] else "-"
        if v.get("weights_fit") is False:
            arch += " (weights do not load)"
            misfits.append(v)
        table.add_row(
            str(v["version"]),
            _when(v["created_at"]),
            v["created_by"],
            arch,
            _metrics(v["metrics"]),
            str(v["lineage"].get("trial_id", "-")),
        )
    print_fitted(table, out)
    for v in misfits:
        out.print(
            f"version {v['version']}: its weights do not load into {v['arch'].get('zoo')}: "
            f"{v.get('weights_problem') or '?'} (registered before registration checked "
            f"them; `trainhub models delete {model['name']}:{v['version']}` removes it)",
            soft_wrap=True,
        )


@app.command()
def download(
    ref: RefArg,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="A file or a directory; default: NAME-vVERSION.pt here."
        ),
    ] = None,
    tenant: TenantOpt = None,
) -> None:
    """Save a version's weights (a checkpoint file for torch.load)."""
    with connect() as client:
        version = _version_of(client, ref, tenant)
        data = client.download_model(version["model"], version["version"], version["tenant"])
    target = _target(output, version, "pt")
    _write(target, data)
    out.print(f"{target} ({len(data)} bytes)")


@app.command()
def share(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A model of your tenant.")],
    tenant: Annotated[str, typer.Argument(metavar="TENANT", help="The tenant to share with.")],
    stop: Annotated[bool, typer.Option("--stop", help="Stop sharing (unshare).")] = False,
) -> None:
    """Let TENANT read model NAME and start trainings from it (tenant admins)."""
    owner, model_name, _ = _split(name)
    with connect() as client:
        model = client.share_model(model_name, tenant, not stop, owner)
    shared = ", ".join(model["shared_with"]) or "nobody"
    out.print(f"{model['tenant']}/{model['name']} shared with: {shared}")


@app.command()
def delete(
    ref: Annotated[
        str, typer.Argument(metavar="NAME:VERSION", help="The version to delete, e.g. lenet:2.")
    ],
    tenant: TenantOpt = None,
) -> None:
    """Delete one version of a model and its weights (refused while a trial uses it).

    Its number is never given to another version: a spec that names NAME:VERSION never
    starts from other weights."""
    owner, model_name, version = _split(ref)
    if version is None:
        raise fail(
            f"{ref!r} names no version",
            f"name the one to delete, e.g. {model_name}:1 (see `trainhub models show "
            f"{model_name}`)",
            code=EXIT_INVALID_INPUT,
        )
    with connect() as client:
        deleted = client.delete_model_version(model_name, version, owner or tenant)
    out.print(f"deleted {deleted['ref']}")


@app.command()
def unshare(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A model of your tenant.")],
    tenant: Annotated[
        str, typer.Argument(metavar="TENANT", help="The tenant to stop sharing with.")
    ],
) -> None:
    """Stop sharing model NAME with TENANT."""
    share(name, tenant, stop=True)


@app.command()
def suggest(
    task: Annotated[
        str,
        typer.Option("--task", help="What the model does; the zoo serves image-classification."),
    ] = "image-classification",
    input_shape: Annotated[
        str, typer.Option("--input", help="One input's shape, CxHxW, e.g. 1x28x28.")
    ] = "1x28x28",
    classes: Annotated[
        int, typer.Option("--classes", min=1, max=1_000_000, help="Number of classes.")
    ] = 10,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, help="Models listed.")] = 10,
    offline: Annotated[bool, typer.Option("--offline", help="The zoo only (no server).")] = False,
) -> None:
    """Rank registered and zoo models by fit: input shape, classes, accuracy, size."""
    from trainhub.core.model_fit import Problem, parse_shape
    from trainhub.models.catalog import IMAGE, left_out
    from trainhub.models.catalog import suggest as rank

    try:
        problem = Problem(task, parse_shape(input_shape), classes)
    except ValueError as exc:
        raise fail(str(exc), code=EXIT_INVALID_INPUT) from None
    registered: list[dict[str, Any]] = []
    if not offline:
        with connect() as client:
            registered = client.list_models()
    fits = rank(problem, registered)
    if not fits:
        archs = [(m.get("latest") or {}).get("arch") or {} for m in registered]
        tasks = sorted({IMAGE, *(str(a.get("task", IMAGE)) for a in archs)})
        raise fail(
            f"no registered or zoo model is for task {task!r}",
            f"tasks with models: {', '.join(tasks)}",
            code=EXIT_INVALID_INPUT,
        )
    table = Table("rank", "model", "score", "parameters", "why")
    for i, fit in enumerate(fits[:limit], 1):
        params = fit.candidate.num_parameters
        table.add_row(
            str(i),
            fit.candidate.ref,
            f"{fit.score:.2f}",
            f"{params:,}" if params else "?",
            "; ".join(fit.reasons),
        )
    print_fitted(table, out)
    for ref, why in left_out(registered):
        out.print(
            f"left out: {ref}: its weights do not load into its architecture"
            + (f" ({why})" if why else "")
            + f"; see `trainhub models show {ref}`",
            soft_wrap=True,
        )


@app.command()
def export(
    ref: RefArg,
    fmt: Annotated[str, typer.Option("--format", help="onnx | torchscript")] = "onnx",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="A file or a directory; default: NAME-vVERSION.onnx (.pt) here."
        ),
    ] = None,
    input_shape: Annotated[
        str | None, typer.Option("--input", help="CxHxW where the version records none")
    ] = None,
    tenant: TenantOpt = None,
) -> None:
    """Export a version to ONNX (checked by onnxruntime against PyTorch) or TorchScript."""
    from trainhub.core.model_fit import parse_shape
    from trainhub.models.export import FORMATS, export_version

    if fmt not in FORMATS:
        raise fail(f"--format {fmt!r}: use one of {', '.join(FORMATS)}", code=EXIT_INVALID_INPUT)
    with connect() as client:
        version = _version_of(client, ref, tenant)
        data = client.download_model(version["model"], version["version"], version["tenant"])
    target = _target(output, version, "onnx" if fmt == "onnx" else "pt")
    arch = dict(version["arch"] or {})
    if input_shape:
        try:
            arch["input"] = list(parse_shape(input_shape))
        except ValueError as exc:
            raise fail(str(exc), code=EXIT_INVALID_INPUT) from None
    try:
        path, diff = export_version(data, arch, fmt, target)
    except ValueError as exc:  # the version does not take that input, or cannot be exported
        raise fail(str(exc), code=EXIT_INVALID_INPUT) from None
    except OSError as exc:
        raise fail(
            f"cannot write {target}: {exc.strerror or exc}",
            "pass -o FILE in a writable directory",
            code=EXIT_INVALID_INPUT,
        ) from None
    out.print(
        f"{path}: {path.stat().st_size} bytes; checked against PyTorch (difference {diff:.2e})"
    )


def compress(
    ref: Annotated[
        str,
        typer.Argument(
            metavar="MODEL[:VERSION]",
            help="The model to compress: NAME, NAME:VERSION or TENANT/NAME:VERSION.",
        ),
    ],
    prune: Annotated[
        float,
        typer.Option("--prune", min=0.0, max=0.95, help="Fraction of the weights set to zero."),
    ] = 0.5,
    structured: Annotated[
        bool, typer.Option("--structured", help="Prune whole output channels, not weights.")
    ] = False,
    quantize: Annotated[str, typer.Option("--quantize", help="int8 | none")] = "int8",
    finetune_epochs: Annotated[
        int,
        typer.Option("--finetune-epochs", min=0, max=100, help="Epochs of training after pruning."),
    ] = 1,
    data: Annotated[
        str,
        typer.Option(
            "--data", help="A trainhub.data dataset, or auto: mnist, or digits for 1x8x8 inputs."
        ),
    ] = "auto",
    name: Annotated[
        str | None, typer.Option("--name", help="Register as; default: MODEL's next version")
    ] = None,
    wait: Annotated[
        bool,
        typer.Option("--wait/--no-wait", help="Wait for the job and register its result."),
    ] = True,
    tenant: TenantOpt = None,
) -> None:
    """Prune and quantize a registered model as a job; register the result as a new version.

    The job runs on the cluster; the new version records its size, accuracy and latency."""
    if quantize not in ("int8", "none"):
        raise fail(f"--quantize {quantize!r}: use int8 or none", code=EXIT_INVALID_INPUT)
    from trainhub.data import available

    if data not in ("auto", *available()):
        names = ", ".join(("auto", *available()))
        raise fail(f"--data {data!r}: use one of {names}", code=EXIT_INVALID_INPUT)
    with connect() as client:
        version = _version_of(client, ref, tenant)
        arch = version["arch"]
        if not arch or not arch.get("zoo"):
            raise fail(
                f"{version['ref']} records no architecture",
                'register it with --arch \'{"zoo": ..., "args": ..., "input": [C, H, W]}\'',
            )
        argv = [
            "python", "-m", "trainhub.jobs.compress", "--arch", json.dumps(arch),
            "--prune", str(prune), "--quantize", quantize,
            "--finetune-epochs", str(finetune_epochs), "--data", data,
        ]  # fmt: skip
        if structured:
            argv.append("--structured")
        spec = {
            "name": f"compress-{version['model']}"[:63],
            "project": "models",
            "entrypoint": shlex.join(argv),
            "model": {"init_from": version["ref"]},
            "hyperparameters": {"prune": prune, "quantize": quantize, "structured": structured},
        }
        experiment = client.submit_experiment(json.dumps(spec), None, version["tenant"])
        trial_id = experiment["trials"][0]["id"]
        out.print(f"compressing {version['ref']} in trial {trial_id}")
        if not wait:
            out.print(
                f"when it completes: trainhub models register {trial_id} --name {version['model']}"
            )
            return
        trial = client.wait_for_trial(trial_id)
        if trial["state"] != "COMPLETED":
            raise fail(
                f"trial {trial_id} ended {trial['state']}", f"trainhub logs {trial_id} --trial"
            )
        registered = client.register_model(
            trial_id,
            name or version["model"],
            arch=arch,
            description=f"{version['ref']} pruned {prune:.0%}, {quantize}",
            lineage={"compressed_from": version["ref"]},
        )
    metrics = registered["metrics"]
    out.print(f"registered {registered['ref']}")
    for key in ("size_ratio", "accuracy", "accuracy_loss_points", "latency_speedup"):
        if key in metrics:
            out.print(f"  {key}: {metrics[key]:.4g}")
