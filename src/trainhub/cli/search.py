"""Commands of searches and steering: trials, pause, resume, kill, clone, limits."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from trainhub.cli.fit import print_fitted
from trainhub.cli.session import EXIT_INVALID_INPUT, connect, fail, out

JSON = dict[str, Any]
TrialOption = Annotated[
    bool, typer.Option("--trial", "-t", help="ID is a trial, not an experiment.")
]


def trials(
    experiment_id: Annotated[int, typer.Argument(metavar="EXPERIMENT_ID")],
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per trial (id, state, hparams, ...).")
    ] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV with a column per hparam.")] = False,
    importance: Annotated[
        bool, typer.Option("--importance", help="Also Optuna's hyperparameter importance.")
    ] = False,
) -> None:
    """The trials of an experiment, best first by the searcher's metric.

    Hyperparameters are columns; each trial shows its state, the best value of the metric, the
    epochs (or steps) it reported, and why it was pruned or paused. Above them: the search's
    progress (trials done, running, pruned; the best so far).
    """
    with connect() as client:
        progress = client.search_progress(experiment_id)
        weights = client.importance(experiment_id) if importance else {}
    rows = progress["data"]
    if as_json:
        for row in rows:
            print(json.dumps({k: row[k] for k in _ROW_KEYS}))
        return
    names = _hparam_names(rows)
    if as_csv:
        writer = csv.writer(sys.stdout)
        # `trial`, as the table and every id the CLI prints say (exp 22 / trial 34)
        writer.writerow(["trial", "state", progress["metric"] or "metric", "done", *names, "why"])
        for row in rows:
            writer.writerow(
                [row["id"], row["state"], row["metric"], row["epochs"]]
                + [row["hparams"].get(n) for n in names]
                + [row["stop_detail"] or ""]
            )
        return
    out.print(progress_line(progress))
    varying, same = _split_constant(rows, names)
    if same:
        from trainhub.cli.render import fmt_value

        label = "same in every trial" if len(rows) > 1 else "hyperparameters"
        out.print(Text(f"{label}: " + ", ".join(f"{k}={fmt_value(v)}" for k, v in same)))
    print_fitted(trials_by_metric_table(progress, varying), out, drop_first=("why",))
    for warning in progress.get("warnings") or []:
        out.print(Text(f"warning: {warning}", style="yellow"))
    if weights:
        out.print("importance: " + ", ".join(f"{k} {v:.2f}" for k, v in weights.items()))


_ROW_KEYS = ("id", "state", "hparams", "metric", "epochs", "stop_detail", "parent_trial_id")


def _hparam_names(rows: list[JSON]) -> list[str]:
    names: list[str] = []
    for row in rows:
        for name in row["hparams"]:
            if name not in names:
                names.append(name)
    return names


def _split_constant(rows: list[JSON], names: list[str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """(the hyperparameters that differ between trials, those that do not with their value):
    the table's columns are what the search varies (a single trial's are all one line)."""
    varying: list[str] = []
    same: list[tuple[str, Any]] = []
    for name in names:
        values = [row["hparams"].get(name, _MISSING) for row in rows]
        if all(v is not _MISSING and v == values[0] for v in values):
            same.append((name, values[0]))
        else:
            varying.append(name)
    return varying, same


_MISSING = object()
_PRUNED_BY = re.compile(r"^pruned by the (\w+) pruner: (?:\S+=(\S+) at step (\d+)\b)?")


def _cell(value: Any) -> str:
    """A hyperparameter in the table: floats to 4 significant digits (the JSON has them all)."""
    from trainhub.cli.render import fmt_value

    if isinstance(value, float) and not isinstance(value, bool):
        return f"{value:.4g}"
    return fmt_value(value)


def _short_why(detail: str | None) -> str:
    """The table's why: "asha at step 3 (0.41)" for a pruner's long reason; others as they are."""
    found = _PRUNED_BY.match(detail or "")
    if found is None:
        return detail or ""
    pruner, value, step = found.groups()
    if value is None:
        return f"{pruner}: {(detail or '')[found.end() :]}"
    return f"{pruner} at step {step} ({value})"


def progress_line(progress: JSON) -> str:
    counts = progress["counts"]
    done = counts.get("COMPLETED", 0)
    running = sum(counts.get(s, 0) for s in ("SCHEDULED", "RUNNING", "PREEMPTING"))
    state = f", {progress['search_state'].lower()}" if progress["search_state"] else ""
    head = f"exp {progress['experiment']['id']} ({progress['searcher']}{state})"
    limit = f"/{progress['max_trials']}" if progress["max_trials"] else ""
    text = (
        f"{head}: {progress['count']}{limit} trials: {done} done, {running} running, "
        f"{counts.get('QUEUED', 0)} queued, {counts.get('PRUNED', 0)} pruned, "
        f"{counts.get('PAUSED', 0)} paused, {counts.get('FAILED', 0)} failed"
    )
    best = progress.get("best")
    if best is not None:
        text += f"; best: trial {best['id']} {progress['metric']}={best['metric']:.4g}"
    return text


def trials_by_metric_table(progress: JSON, names: list[str]) -> Any:
    from trainhub.cli.render import state_text, titled_table

    table = titled_table("trials")
    table.add_column("trial", justify="right", no_wrap=True, min_width=5)
    table.add_column("state", no_wrap=True, min_width=9)
    table.add_column(Text(progress["metric"] or "metric"), justify="right", min_width=7)
    table.add_column("done", justify="right", no_wrap=True)  # an hparam may be called epochs
    for name in names:
        table.add_column(Text(name), justify="right")
    # one line a trial: the whole reason is in --json and `trainhub show --trial ID`
    table.add_column("why", no_wrap=True, overflow="ellipsis", max_width=28)
    for row in progress["data"]:
        table.add_row(
            str(row["id"]),
            state_text(row["state"]),
            "" if row["metric"] is None else f"{row['metric']:.4g}",
            "" if row["epochs"] is None else str(row["epochs"]),
            *(_cell(row["hparams"][n]) if n in row["hparams"] else "-" for n in names),
            Text(_short_why(row["stop_detail"])),
        )
    return table


def _steer(object_id: int, trial: bool, action: str) -> None:
    kind = "trial" if trial else "experiment"
    with connect() as client:
        body = client.steer(kind, object_id, action)
    if trial:
        out.print(f"trial {object_id}: {body['state']}")
    elif "counts" in body:
        out.print(progress_line(body))
    else:
        states = sorted({t["state"] for t in body.get("trials", [])})
        out.print(f"exp {object_id}: {body['state']} ({', '.join(states) or 'no trials'})")


def pause(
    object_id: Annotated[int, typer.Argument(metavar="ID")], trial: TrialOption = False
) -> None:
    """Pause an experiment (every trial; a search makes no new ones) or a trial (--trial).

    A running trial is asked to checkpoint and stop; it waits PAUSED with its slots freed.
    """
    _steer(object_id, trial, "pause")


def resume(
    object_id: Annotated[int, typer.Argument(metavar="ID")], trial: TrialOption = False
) -> None:
    """Resume a paused experiment or trial (--trial); trials restart from their checkpoint."""
    _steer(object_id, trial, "resume")


def kill(
    object_id: Annotated[int, typer.Argument(metavar="ID")], trial: TrialOption = False
) -> None:
    """Stop an experiment and its search for good, or one trial (--trial)."""
    _steer(object_id, trial, "kill")


def parse_changes(pairs: list[str]) -> dict[str, Any]:
    """``lr=0.01`` -> {"lr": 0.01}; values are YAML (numbers, strings, {type: float, ...})."""
    from trainhub.core.errors import InvalidRequest
    from trainhub.core.spec_changes import parse_changes as parse

    try:
        return parse(pairs)
    except InvalidRequest as exc:
        raise fail(
            f"--set {exc.message}",
            "e.g. --set lr=0.01 --set searcher.max_trials=64",
            code=EXIT_INVALID_INPUT,
        ) from None


def clone(
    object_id: Annotated[
        int, typer.Argument(metavar="ID", help="An experiment id, or a trial id with --trial.")
    ],
    changes: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="PATH=VALUE, repeatable: lr=0.01 (a hyperparameter), searcher.max_trials=64.",
        ),
    ] = None,
    from_checkpoint: Annotated[
        int | None,
        typer.Option(
            "--from-checkpoint",
            metavar="TRIAL",
            help="Warm-start from this trial's latest checkpoint.",
        ),
    ] = None,
    trial: TrialOption = False,
    drop_flagged: Annotated[
        float | None,
        typer.Option(
            "--drop-flagged",
            min=0.0,
            max=0.5,
            metavar="FRACTION",
            help="Trial only: retrain without this fraction of its most likely mislabeled "
            "samples (e.g. 0.05; see `trainhub debug`).",
        ),
    ] = None,
    relabel: Annotated[
        Path | None,
        typer.Option(
            "--relabel",
            metavar="FILE",
            help="Trial only: retrain with these labels, a CSV with columns id and label.",
        ),
    ] = None,
) -> None:
    """Submit a copy of an experiment (or of one trial, --trial) with changes.

    A cloned trial becomes a single-trial experiment with its hyperparameters as constants;
    `trainhub clone T --trial --from-checkpoint T` also starts it from T's latest checkpoint.
    `--drop-flagged` and `--relabel` clone a trial (they imply --trial); its runtime's data
    loaders leave those samples out or relabel them (docs/debugging.md).
    """
    parsed = parse_changes(changes or [])
    relabels = None
    if relabel is not None:
        from trainhub.cli.debugging import read_relabel_file

        relabels = read_relabel_file(relabel)
    if drop_flagged is not None and drop_flagged <= 0:
        raise fail("--drop-flagged must be above 0", "e.g. 0.05 for 5%", code=EXIT_INVALID_INPUT)
    trial = trial or drop_flagged is not None or relabels is not None
    with connect() as client:
        if trial and (drop_flagged is not None or relabels is not None):
            if from_checkpoint is not None:
                raise fail(
                    "--drop-flagged and --relabel retrain from scratch",
                    "leave out --from-checkpoint",
                    code=EXIT_INVALID_INPUT,
                )
            body = client.clone_trial(
                object_id, parsed, False, drop_flagged=drop_flagged, relabel=relabels
            )
        elif trial:
            if from_checkpoint not in (None, object_id):
                raise fail(
                    "a cloned trial can only start from its own checkpoint",
                    f"use --from-checkpoint {object_id}, or clone trial {from_checkpoint}",
                    code=EXIT_INVALID_INPUT,
                )
            body = client.clone_trial(object_id, parsed, from_checkpoint is not None)
        else:
            body = client.clone_experiment(object_id, parsed, from_checkpoint)
    out.print(
        f"submitted exp {body['id']} ({body['name']}), a clone of "
        f"{'trial' if trial else 'experiment'} {object_id}"
    )


def limits(
    experiment_id: Annotated[int, typer.Argument(metavar="EXPERIMENT_ID")],
    max_trials: Annotated[int | None, typer.Option(min=1, help="Trials in all.")] = None,
    max_concurrent_trials: Annotated[
        int | None, typer.Option(min=1, help="Trials queued or running at once.")
    ] = None,
) -> None:
    """Raise or lower the limits of a running search (raising max_trials revives a finished one)."""
    if max_trials is None and max_concurrent_trials is None:
        raise fail(
            "nothing to change",
            "give --max-trials and/or --max-concurrent-trials",
            code=EXIT_INVALID_INPUT,
        )
    with connect() as client:
        progress = client.set_search_limits(experiment_id, max_trials, max_concurrent_trials)
    out.print(progress_line(progress))


template_app = typer.Typer(
    help="Named specs of a tenant (with their code), to submit again with changes.",
    no_args_is_help=True,
)


@template_app.command("ls")
def template_ls() -> None:
    """List the templates of your tenants."""
    with connect() as client:
        rows = client.list_templates()
    if not rows:
        out.print("no templates; save one with `trainhub template save NAME SPEC`")
        return
    for row in rows:
        code = "with code" if row["has_context"] else "no code"
        out.print(f"{row['tenant']}/{row['name']} ({code}, saved by {row['created_by']})")


@template_app.command("save")
def template_save(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    spec_file: Annotated[
        Path | None, typer.Argument(metavar="SPEC", help="The spec; its directory is the code.")
    ] = None,
    context_dir: Annotated[
        Path | None, typer.Option("--context", "-C", help="Code directory (default: SPEC's).")
    ] = None,
    experiment: Annotated[
        int | None, typer.Option("--from", metavar="EXP", help="Save this experiment instead.")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant of the template.")] = None,
) -> None:
    """Save a spec (and its code directory) or an experiment (--from EXP) as a template."""
    if (spec_file is None) == (experiment is None):
        raise fail("give a SPEC file or --from EXP", code=EXIT_INVALID_INPUT)
    spec_text: str | None = None
    context: bytes | None = None
    if spec_file is not None:
        from trainhub.cli.context import ContextError, pack_context

        try:
            spec_text = spec_file.read_text()
            context = pack_context((context_dir or spec_file.parent).resolve()).data
        except (OSError, ContextError) as exc:
            raise fail(str(exc), code=EXIT_INVALID_INPUT) from None
    with connect() as client:
        row = client.save_template(name, spec_text, context, tenant, experiment)
    out.print(f"saved template {row['tenant']}/{row['name']}")


@template_app.command("submit")
def template_submit(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    changes: Annotated[
        list[str] | None, typer.Option("--set", help="PATH=VALUE, repeatable (as for clone).")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant of the template.")] = None,
) -> None:
    """Submit a template with changes, e.g. --set lr=0.01 --set searcher.max_trials=64."""
    parsed = parse_changes(changes or [])
    with connect() as client:
        body = client.submit_template(name, parsed, tenant)
    out.print(f"submitted exp {body['id']} ({body['name']}) from template {name}")
