"""Commands on experiments and trials: submit, ls, show, cancel, logs, metrics."""

from __future__ import annotations

import csv
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from trainhub.cli.fit import print_fitted
from trainhub.cli.ids import ID_HELP, TrialOpt, parse_ref, trial_of
from trainhub.cli.session import (
    EXIT_INTERRUPTED,
    EXIT_INVALID_INPUT,
    connect,
    err,
    fail,
    out,
    print_field_errors,
)
from trainhub.core import limits
from trainhub.core.states import ExperimentState

if TYPE_CHECKING:
    from trainhub.cli.context import PackedContext
    from trainhub.client import TrainhubClient
    from trainhub.core.spec import ExperimentSpec

JSON = dict[str, Any]


# -- submit --


def _load_spec(spec_file: Path) -> tuple[str, ExperimentSpec]:
    from trainhub.core.errors import InvalidSpec
    from trainhub.core.spec import parse_spec

    try:
        text = spec_file.read_text()
    except OSError as exc:
        message = f"cannot read the spec {spec_file}: {exc.strerror}"
        raise fail(message, code=EXIT_INVALID_INPUT) from None
    try:
        return text, parse_spec(text)
    except InvalidSpec as exc:
        err.print(f"[bold red]{escape(str(spec_file))} is not a valid experiment spec:[/]")
        print_field_errors(exc.errors)
        raise typer.Exit(EXIT_INVALID_INPUT) from None


def _pack(spec: ExperimentSpec, root: Path) -> PackedContext:
    from trainhub.cli.context import ContextError, human_bytes, pack_context
    from trainhub.core.errors import InvalidSpec
    from trainhub.core.spec import check_entrypoint_exists, entrypoint_script

    try:
        packed = pack_context(root)
    except ContextError as exc:
        raise fail(str(exc), code=EXIT_INVALID_INPUT) from None
    try:
        check_entrypoint_exists(spec, packed.names)
    except InvalidSpec as exc:
        err.print("[bold red]the entrypoint cannot run from the code context:[/]")
        print_field_errors(exc.errors)
        script = entrypoint_script(spec.entrypoint) or ""
        if script and (root / script).exists():
            err.print(
                f"[dim]hint:[/] {escape(str(root / script))} exists but is excluded by a "
                ".gitignore or .trainhubignore pattern; re-include it with a line "
                f"`!{escape(script)}` in {escape(str(root / '.trainhubignore'))}"
            )
        else:
            err.print(
                f"[dim]the code context is {escape(str(root))} ({len(packed.files)} files)[/]"
            )
        raise typer.Exit(EXIT_INVALID_INPUT) from None
    note = (
        f"packed {root}: {len(packed.files)} files, {human_bytes(packed.unpacked_bytes)} "
        f"({human_bytes(len(packed.data))} compressed)"
    )
    err.print(f"[dim]{escape(note)}[/]")
    for skipped in packed.skipped:
        err.print(f"[yellow]skipped {escape(skipped)}[/]")
    return packed


def submit(
    spec_file: Annotated[
        Path, typer.Argument(metavar="SPEC.yaml", help="The experiment spec (YAML).")
    ],
    context_dir: Annotated[
        Path | None,
        typer.Option(
            "--context",
            "-C",
            help="The code directory to upload; default: the spec file's directory. "
            ".gitignore and .trainhubignore patterns are honoured.",
            file_okay=False,
        ),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option(help="Tenant to submit to; default: your only tenant.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Show the trial live until it ends.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option(help="Validate and pack, list the files, upload nothing.")
    ] = False,
) -> None:
    """Validate a spec, pack its code directory, and submit the experiment.

    The spec and the entrypoint are checked here first; nothing is uploaded when they are wrong
    (exit code 2). With --follow the exit code is 0 when the trial completes, 1 otherwise.
    """
    spec_yaml, spec = _load_spec(spec_file)
    root = (context_dir or spec_file.parent).resolve()
    packed = _pack(spec, root)
    if dry_run:
        for f in packed.files:
            out.print(Text(f.path))
        return
    with connect() as client:
        experiment = client.submit_experiment(spec_yaml, packed.data, tenant)
        trials = experiment["trials"]
        out.print(
            f"Submitted exp [bold]{experiment['id']}[/] ({escape(experiment['name'])}) "
            f"to tenant {escape(experiment['tenant'])}: "
            + ", ".join(f"trial [bold]{t['id']}[/] {t['state']}" for t in trials)
        )
        from trainhub.cli.render import next_steps

        first = trials[0]["id"] if trials else None
        log_ref = str(experiment["id"]) if len(trials) == 1 else f"trial/{first}"
        if not follow:
            steps = [(f"trainhub show {experiment['id']}", "state, attempts, metrics")]
            if first is not None:
                steps += [
                    (f"trainhub show --trial {first} -f", "follow it live until it ends"),
                    (f"trainhub logs {log_ref} -f", "follow the output of rank 0"),
                ]
            steps.append((f"trainhub cancel {experiment['id']}", "cancel it"))
            out.print(next_steps(steps), end="")
            return
        if first is None:
            return
        if len(trials) > 1:
            err.print(f"[dim]following trial {first}, the first of {len(trials)}[/]")
        raise typer.Exit(_follow(client, first))


def _follow(client: TrainhubClient, trial_id: int) -> int:
    from trainhub.cli.follow import exit_code_of, follow_trial

    try:
        trial = follow_trial(client, trial_id, out)
    except KeyboardInterrupt:
        err.print(
            f"\nstopped following; trial {trial_id} keeps running. "
            f"Follow again with `trainhub show --trial {trial_id} -f`, "
            f"cancel it with `trainhub cancel --trial {trial_id}`."
        )
        return EXIT_INTERRUPTED
    return exit_code_of(trial)


# -- ls, show, cancel --


class ListSort(StrEnum):
    created = "created"
    name = "name"
    best = "best"


class ListOrder(StrEnum):
    asc = "asc"
    desc = "desc"


def ls(
    state: Annotated[
        ExperimentState | None,
        typer.Option("--state", "-s", case_sensitive=False, help="Only experiments in this state."),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only this tenant's experiments.")
    ] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this submitter's.")] = None,
    sort: Annotated[
        ListSort,
        typer.Option("--sort", help="created, name, or best (the searcher metric's best value)."),
    ] = ListSort.created,
    order: Annotated[
        ListOrder, typer.Option("--order", help="desc: newest, last name or best first.")
    ] = ListOrder.desc,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 20,
) -> None:
    """List experiments, newest first (or by --sort)."""
    from trainhub.cli.render import experiments_table

    for flag, value in (("--tenant", tenant), ("--user", user)):
        if value is not None and len(value) > limits.MAX_LIST_FILTER_CHARS:
            raise typer.BadParameter(
                f"at most {limits.MAX_LIST_FILTER_CHARS} characters", param_hint=flag
            )
    with connect() as client:
        page = client.list_experiments(
            state.value if state else None,
            limit,
            tenant=tenant,
            user=user,
            sort=sort.value,
            order=order.value,
        )
    if not page["data"]:
        out.print("no experiments" + (f" in state {state.value}" if state else ""))
        return
    print_fitted(experiments_table(page["data"]), out, drop_first=("owner", "tenant"))
    if page["count"] > len(page["data"]):
        err.print(f"[dim]showing {len(page['data'])} of {page['count']}; use --limit[/]")


TrialFlag = Annotated[bool, typer.Option("--trial", "-t", help="ID is a trial id.")]


def show(
    id_: Annotated[
        int, typer.Argument(metavar="ID", help="An experiment id (a trial id with --trial).")
    ],
    trial: TrialFlag = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Follow the trial live until it ends.")
    ] = False,
) -> None:
    """Show an experiment (and its trial, when it has one), or a trial with --trial.

    A trial shows its state, pending reason, progress, latest metrics, "where the time goes"
    (time/*, comm/*, throughput/* metrics), attempts, checkpoints and recent events.
    """
    from trainhub.cli.render import experiment_view, trial_view

    with connect() as client:
        if trial:
            if follow:
                raise typer.Exit(_follow(client, id_))
            out.print(trial_view(client.get_trial(id_)))
            return
        experiment = client.get_experiment(id_)
        trial_ids = experiment["trial_ids"]
        if follow:
            if len(trial_ids) != 1:
                raise fail(
                    f"exp {id_} has {len(trial_ids)} trials",
                    "follow one of them with `trainhub show --trial ID -f`",
                )
            raise typer.Exit(_follow(client, trial_ids[0]))
        searcher = (experiment.get("spec") or {}).get("searcher") or {}
        progress = None
        if (
            searcher.get("sampler")
            or searcher.get("pruner")
            or searcher.get("name")
            not in (
                None,
                "single",
            )
        ):
            progress = client.search_progress(id_)
        search_state = progress["search_state"] if progress else None
        experiment = {**experiment, "state": shown_state(experiment, search_state)}
        out.print(experiment_view(experiment))
        if progress is not None:
            from trainhub.cli.search import progress_line

            out.print(progress_line(progress))  # done/running/pruned, best
        if len(trial_ids) == 1:
            out.print()
            out.print(trial_view(client.get_trial(trial_ids[0])))


def shown_state(experiment: JSON, search_state: str | None) -> str:
    """The state a user sees: PAUSED for an unfinished experiment whose search is paused, or
    whose unfinished trials are all paused (the stored state says ACTIVE)."""
    state = str(experiment["state"])
    if state != ExperimentState.ACTIVE:
        return state
    if search_state == "PAUSED":
        return "PAUSED"
    unfinished = [
        t["state"]
        for t in experiment.get("trials") or []
        if t["state"] not in ("COMPLETED", "FAILED", "CANCELED", "PRUNED")
    ]
    if unfinished and all(s in ("PAUSED",) for s in unfinished):
        return "PAUSED"
    return state


def cancel(
    id_: Annotated[
        int, typer.Argument(metavar="ID", help="An experiment id (a trial id with --trial).")
    ],
    trial: TrialFlag = False,
) -> None:
    """Cancel an experiment's unfinished trials, or one trial with --trial.

    Queued trials end at once; running ones are stopped within a scheduler tick.
    """
    with connect() as client:
        if trial:
            trials = [client.cancel_trial(id_)]
            out.print(f"trial {id_}: {_cancel_state(trials[0])}")
            return
        experiment = client.cancel_experiment(id_)
        out.print(f"exp {id_} ({escape(experiment['name'])}): {experiment['state']}")
        for t in experiment["trials"]:
            out.print(f"  trial {t['id']}: {_cancel_state(t)}")


def _cancel_state(t: JSON) -> str:
    if t["state"] in ("CANCELED", "COMPLETED", "FAILED", "PRUNED"):
        return str(t["state"])
    return f"{t['state']}, stopping (it checkpoints and exits within a scheduler tick)"


# -- logs, metrics --


def logs(
    ref: Annotated[str, typer.Argument(metavar="ID", help=ID_HELP)],
    trial: TrialOpt = False,
    rank: Annotated[int, typer.Option("--rank", "-r", min=0, help="Which rank's output.")] = 0,
    attempt: Annotated[
        int | None, typer.Option("--attempt", "-a", min=1, help="Default: the latest.")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new output until the trial ends."),
    ] = False,
    poll_interval_s: Annotated[float, typer.Option(hidden=True)] = 1.0,
    env: Annotated[
        bool,
        typer.Option("--env", help="Print the build log of the trial's environment instead."),
    ] = False,
) -> None:
    """Print the output (stdout and stderr) of one rank of a trial.

    ID is an experiment (its trial) or a trial: `trainhub logs 22`, `trainhub logs trial/34`."""
    if env:
        with connect() as client:
            found = client.trial_environment(trial_of(client, parse_ref(ref, trial), "logs"))
        sys.stdout.write(found["build_log"].rstrip("\n") + "\n" if found["build_log"] else "")
        key = (found["key"] or found["request_key"])[:12]
        err.print(f"[dim]environment {key}: {found['state']}[/]")
        if found["error"]:
            err.print(escape(found["error"]))
        return
    with connect() as client:
        trial_id = trial_of(client, parse_ref(ref, trial), "logs")
        first = client.read_logs(trial_id, rank, attempt, 0, limit=1)
        if first["attempt"] == 0:
            t = client.get_trial(trial_id)
            why = f" ({t['pending_reason']})" if t.get("pending_reason") else ""
            ref = f"trial/{trial_id}"
            if first["complete"]:
                err.print(f"trial {trial_id} ended ({t['state']}) without running")
                return
            if not follow:
                err.print(
                    f"trial {trial_id} has no attempts yet: it is {t['state']}{escape(why)}; "
                    f"follow its output with `trainhub logs {ref} -f`"
                )
                return
            err.print(f"[dim]waiting for trial {trial_id} to start: {t['state']}{escape(why)}[/]")
        shown_attempt: int | None = None
        printed = False
        try:
            for chunk in client.iter_logs(
                trial_id, rank, attempt, follow=follow, poll_interval_s=poll_interval_s
            ):
                if shown_attempt is not None and chunk["attempt"] != shown_attempt:
                    err.print(f"[dim]--- attempt {chunk['attempt']} ---[/]")
                shown_attempt = chunk["attempt"]
                sys.stdout.write(chunk["text"])
                sys.stdout.flush()
                printed = True
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        if not printed:
            said = "wrote no output" if first["complete"] else "has written no output yet"
            err.print(f"attempt {first['attempt']}, rank {rank} {said}")


def metrics(
    ref: Annotated[str, typer.Argument(metavar="ID", help=ID_HELP)],
    trial: TrialOpt = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")] = False,
    keys: Annotated[
        str | None, typer.Option("--keys", "-k", help="Comma-separated metric names to show.")
    ] = None,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all",
            help="The table shows the runtime's own series too: step timing and "
            "communication (time/*, comm/*, throughput/*) and ctx.watch's layer statistics "
            "(layers/*), with their own steps; CSV always has them.",
        ),
    ] = False,
) -> None:
    """Print the metrics a trial reported, one row per step.

    ID is an experiment (its trial) or a trial: `trainhub metrics 22`, `trainhub metrics
    trial/34`."""
    from trainhub.cli.render import metric_keys, metric_points_table
    from trainhub.core.step_timing import is_runtime_metric

    with connect() as client:
        trial_id = trial_of(client, parse_ref(ref, trial), "metrics")
        points = client.list_metrics(trial_id, limit=100_000)
    names = [k.strip() for k in keys.split(",") if k.strip()] if keys else metric_keys(points)
    hidden: list[str] = []
    if not (keys or as_csv or show_all):  # the script's own metrics; the runtime's on asking
        hidden = [n for n in names if is_runtime_metric(n)]
        names = [n for n in names if not is_runtime_metric(n)]
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["step", "attempt", "reported_at", *names])
        for p in points:
            values = p["values"]
            writer.writerow(
                [p["step"], p["attempt"], p["reported_at"], *(values.get(k, "") for k in names)]
            )
        return
    if not points:
        err.print(f"trial {trial_id} has reported no metrics yet")
        return
    # only the steps that reported a shown metric: ctx.watch's per-batch steps would otherwise
    # add rows empty of the script's own (per-epoch) metrics
    shown = set(names)
    rows = [p for p in points if shown.intersection(p["values"])]
    print_fitted(metric_points_table(rows, names), out, keep=("step",))
    if hidden:
        plural = "s" if len(hidden) != 1 else ""
        err.print(
            f"[dim]{len(hidden)} metric{plural} of the runtime not shown (step timing, "
            "communication, layer statistics): --all, or -k NAME,...[/]"
        )
