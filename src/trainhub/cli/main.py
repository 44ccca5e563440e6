"""The ``trainhub`` command line: run the server, submit and watch experiments, administer.

Commands talk to the server at TRAINHUB_URL with TRAINHUB_TOKEN, or to what ``trainhub login``
saved. Importing this module is cheap: the server side, the spec parser and the HTTP client are
imported inside the commands that need them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from trainhub.cli import (
    admin,
    auth,
    data,
    debugging,
    environments,
    experiments,
    interactive,
    models,
    nodes,
    profile,
    scheduling,
    search,
    storage,
)
from trainhub.cli.session import EXIT_CODES_HELP
from trainhub.core import limits
from trainhub.core.scheduling.factory import DEFAULT_POLICY, POLICY_NAMES, policy_help
from trainhub.core.scheduling.fair_config import FairShareConfig

# the choices, help and defaults come from the one registry and the one config (pure core:
# no heavy module is imported with them)
Policy = StrEnum("Policy", {name.upper(): name for name in POLICY_NAMES})  # type: ignore[misc]
_FAIR_DEFAULTS = FairShareConfig()


class RankStorage(StrEnum):
    CONTROL_PLANE = "control-plane"
    DIRECT = "direct"


class Sandbox(StrEnum):
    AUTO = "auto"
    BWRAP = "bwrap"
    NONE = "none"


class SessionRelay(StrEnum):
    AUTO = "auto"
    ALWAYS = "always"


class EnvBuild(StrEnum):
    AUTO = "auto"
    HERE = "here"
    NODES = "nodes"


app = typer.Typer(
    name="trainhub",
    help="Deep-learning training as a service. Talks to TRAINHUB_URL with TRAINHUB_TOKEN, "
    "or to the server saved by `trainhub login`.\n\n"
    "Ids: an experiment is 22 or exp/22, a trial trial/34 (or 34 with --trial); logs, "
    "metrics, debug and profile take either (an experiment stands for its one trial).\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals would print tokens
    context_settings={"help_option_names": ["-h", "--help"]},
)

app.command(rich_help_panel="Experiments")(experiments.submit)
app.command(rich_help_panel="Experiments")(experiments.ls)
app.command(rich_help_panel="Experiments")(experiments.show)
app.command(rich_help_panel="Experiments")(experiments.logs)
app.command(rich_help_panel="Experiments")(experiments.metrics)
app.command(rich_help_panel="Experiments")(experiments.cancel)
app.command(rich_help_panel="Experiments")(profile.profile)
app.command(rich_help_panel="Search and steering")(search.trials)
app.command(rich_help_panel="Search and steering")(search.pause)
app.command(rich_help_panel="Search and steering")(search.resume)
app.command(rich_help_panel="Search and steering")(search.kill)
app.command(rich_help_panel="Search and steering")(search.clone)
app.command(rich_help_panel="Search and steering")(search.limits)
app.command(rich_help_panel="Experiments")(debugging.debug)
app.add_typer(search.template_app, name="template", rich_help_panel="Search and steering")
app.command(rich_help_panel="Scheduling")(scheduling.queue)
app.command(rich_help_panel="Scheduling")(scheduling.priority)
app.command(rich_help_panel="Scheduling")(scheduling.usage)
app.add_typer(models.app, name="models", rich_help_panel="Models")
app.add_typer(data.app, name="data", rich_help_panel="Models")
app.command(rich_help_panel="Models")(models.compress)
app.command(rich_help_panel="Account")(auth.login)
app.command(rich_help_panel="Account")(auth.logout)
app.command(rich_help_panel="Account")(auth.whoami)
app.add_typer(admin.tenants_app, name="tenants", rich_help_panel="Administration")
app.add_typer(admin.users_app, name="users", rich_help_panel="Administration")
app.add_typer(admin.tokens_app, name="tokens", rich_help_panel="Administration")
app.command(rich_help_panel="Administration")(admin.cluster)
app.add_typer(nodes.app, name="nodes", rich_help_panel="Administration")
app.add_typer(environments.app, name="envs", rich_help_panel="Experiments")
app.command(rich_help_panel="Sessions")(interactive.notebook)
app.command(rich_help_panel="Sessions")(interactive.shell)
app.command(rich_help_panel="Sessions")(interactive.tensorboard)
app.add_typer(interactive.app, name="sessions", rich_help_panel="Sessions")


server_app = typer.Typer(
    help="Run the control plane (API and scheduler); `trainhub server stop` ends it.",
    no_args_is_help=False,
)
app.add_typer(server_app, name="server", rich_help_panel="Control plane")
app.add_typer(storage.app, name="storage", rich_help_panel="Control plane")


@server_app.callback(invoke_without_command=True)
def server(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            envvar="TRAINHUB_DB_URL",
            help="Database URL: sqlite:///PATH or postgresql://USER@HOST/DB; "
            "default: SQLite in the home directory.",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            envvar="TRAINHUB_RAY_ADDRESS",
            help="Address of a Ray cluster (HOST:PORT); default: a local Ray started once.",
        ),
    ] = None,
    ray_namespace: Annotated[
        str,
        typer.Option(
            envvar="TRAINHUB_RAY_NAMESPACE",
            help="Ray namespace of this server's actors and placement groups; two servers on "
            "one Ray cluster need different ones.",
        ),
    ] = "trainhub",
    storage: Annotated[
        str | None,
        typer.Option(
            envvar="TRAINHUB_STORAGE",
            help="Directory for contexts, logs and checkpoints, or s3://BUCKET/PREFIX "
            "(credentials from the AWS variables or files; docs/storage.md); "
            "default: HOME/artifacts.",
        ),
    ] = None,
    s3_endpoint: Annotated[
        str | None,
        typer.Option(
            envvar="TRAINHUB_S3_ENDPOINT",
            help="URL of an S3-compatible server for --storage s3://...; default: AWS.",
        ),
    ] = None,
    rank_storage: Annotated[
        RankStorage,
        typer.Option(
            envvar="TRAINHUB_RANK_STORAGE",
            help="How ranks move checkpoints with --storage s3://...: 'control-plane' "
            "(through the server's API) or 'direct' (to the bucket with presigned URLs the "
            "server signs per trial and object; the endpoint must be reachable from the "
            "nodes). ADR 0033.",
        ),
    ] = RankStorage.CONTROL_PLANE,
    host: Annotated[str, typer.Option(envvar="TRAINHUB_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="TRAINHUB_PORT", min=1, max=65535)] = 8080,
    home: Annotated[
        Path | None,
        typer.Option(envvar="TRAINHUB_HOME", help="State directory; default: ~/.trainhub."),
    ] = None,
    advertise_url: Annotated[
        str | None,
        typer.Option(
            envvar="TRAINHUB_ADVERTISE_URL",
            help="The URL trials use to reach this server; default: http://HOST:PORT.",
        ),
    ] = None,
    num_cpus: Annotated[
        int | None, typer.Option(min=1, help="CPUs of a local Ray started now.")
    ] = None,
    num_gpus: Annotated[
        int | None, typer.Option(min=0, help="GPUs of a local Ray started now.")
    ] = None,
    tick_interval_s: Annotated[
        float, typer.Option(min=0.05, help="Seconds between scheduler ticks.")
    ] = 1.0,
    policy: Annotated[
        Policy | None,
        typer.Option(
            envvar="TRAINHUB_POLICY",
            case_sensitive=False,
            help=policy_help(DEFAULT_POLICY),
        ),
    ] = None,
    min_run_time_s: Annotated[
        float | None,
        typer.Option(
            envvar="TRAINHUB_MIN_RUN_TIME_S",
            min=0.0,
            help="Seconds a trial runs before it may be preempted (fair share); default: "
            f"{_FAIR_DEFAULTS.min_run_time_s:g}.",
        ),
    ] = None,
    preemption_cooldown_s: Annotated[
        float | None,
        typer.Option(
            envvar="TRAINHUB_PREEMPTION_COOLDOWN_S",
            min=0.0,
            help="Seconds a trial that was preempted before is protected after each restart, "
            "on top of the minimum run time (fair share); default: "
            f"{_FAIR_DEFAULTS.preemption_cooldown_s:g}.",
        ),
    ] = None,
    reclaim_patience: Annotated[
        float | None,
        typer.Option(
            envvar="TRAINHUB_RECLAIM_PATIENCE",
            min=0.0,
            max=1.0,
            help="A tenant below its guarantee that received more than this share of its "
            "recent entitlement waits for GPUs to free instead of preempting (fair share; "
            f"0 turns it off); default: {_FAIR_DEFAULTS.patience_share or 0:g}.",
        ),
    ] = None,
    reclaim_rate: Annotated[
        float | None,
        typer.Option(
            envvar="TRAINHUB_RECLAIM_RATE",
            min=0.0,
            help="The share of the cluster's slots that preemptions giving tenants back their "
            "guarantees may take per hour (fair share; 0: unbounded); default: "
            f"{_FAIR_DEFAULTS.reclaim_rate_share_per_h or 0:g}.",
        ),
    ] = None,
    usage_half_life_s: Annotated[
        float | None,
        typer.Option(
            envvar="TRAINHUB_USAGE_HALF_LIFE_S",
            min=0.001,
            help="Half-life of the past usage fair share orders tenants by; default: "
            f"{_FAIR_DEFAULTS.half_life_s:g}.",
        ),
    ] = None,
    sandbox: Annotated[
        Sandbox,
        typer.Option(
            envvar="TRAINHUB_SANDBOX",
            case_sensitive=False,
            help="How trial processes are isolated: bwrap (bubblewrap: own PIDs, a private "
            "filesystem view), none (plain processes: trusted tenants only), or auto (bwrap "
            "where it works here, else none with a warning in the log and `trainhub cluster`).",
        ),
    ] = Sandbox.AUTO,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="TRAINHUB_DATA_DIR",
            help="Datasets every trial may read (read-only; TRAINHUB_DATA_DIR in trials).",
        ),
    ] = None,
    env_cache: Annotated[
        Path | None,
        typer.Option(
            envvar="TRAINHUB_ENV_CACHE",
            help="Where trial environments are built and cached (default HOME/envs); on a "
            "cluster, storage every node mounts at the same path (docs/environments.md).",
        ),
    ] = None,
    env_build: Annotated[
        EnvBuild,
        typer.Option(
            envvar="TRAINHUB_ENV_BUILD",
            help="Where trial environments are installed: 'here' (into --env-cache, which "
            "nodes must mount), 'nodes' (each node that runs a rank installs it into its own "
            "cache: no shared folder), 'auto' ('nodes' with an s3:// --storage, else 'here').",
        ),
    ] = EnvBuild.AUTO,
    env_cache_gb: Annotated[
        float | None,
        typer.Option(
            envvar="TRAINHUB_ENV_CACHE_GB",
            min=0.001,
            help="Size of the environment cache past which the least recently used "
            "environments no trial needs are removed; default: no bound.",
        ),
    ] = None,
    dataset_cache_gb: Annotated[
        float,
        typer.Option(
            envvar="TRAINHUB_DATASET_CACHE_GB",
            min=0.001,
            help="Size cap of each node's cache of tenant datasets, in GiB (least recently "
            "used versions go first; docs/data.md).",
        ),
    ] = 50.0,
    monitor_interval_s: Annotated[
        float,
        typer.Option(
            envvar="TRAINHUB_MONITOR_INTERVAL_S",
            min=0.0,
            help="Seconds between samples of the node agents (CPU, memory, GPUs); 0 turns "
            "node monitoring off (docs/monitoring.md).",
        ),
    ] = 5.0,
    max_log_mb_per_trial: Annotated[
        float | None,
        typer.Option(
            envvar="TRAINHUB_MAX_LOG_MB_PER_TRIAL",
            min=0.1,
            help="Output an attempt stores, shared by its ranks; past it a log keeps its "
            "first lines and its latest, with a marker (default: "
            f"{limits.DEFAULT_MAX_LOG_BYTES_PER_TRIAL // 1024**2} MiB).",
        ),
    ] = None,
    max_metric_points_per_minute: Annotated[
        int | None,
        typer.Option(
            envvar="TRAINHUB_MAX_METRIC_POINTS_PER_MINUTE",
            min=limits.MAX_POINTS_PER_REQUEST,
            help="Metric points one trial may send a minute; more are answered 429 and the "
            f"runtime sends them later (default: {limits.MAX_METRIC_POINTS_PER_MINUTE}).",
        ),
    ] = None,
    max_metric_points_per_trial: Annotated[
        int | None,
        typer.Option(
            envvar="TRAINHUB_MAX_METRIC_POINTS_PER_TRIAL",
            min=1,
            help="Metric points one trial may store in all; more are dropped and counted "
            f"(default: {limits.MAX_METRIC_POINTS_PER_TRIAL}).",
        ),
    ] = None,
    pids_per_rank: Annotated[
        int,
        typer.Option(
            envvar="TRAINHUB_PIDS_PER_RANK",
            min=16,
            help="The most processes and threads one rank may have (its cgroup's pids.max; "
            "sandboxed ranks, docs/security.md).",
        ),
    ] = 512,
    warm_pool_size: Annotated[
        int,
        typer.Option(
            envvar="TRAINHUB_WARM_POOL_SIZE",
            min=0,
            max=64,
            help="Idle processes with torch imported kept on each node to start ranks from "
            "(they hold no slot); used for unsandboxed trials on the base environment; 0 "
            "turns the pool off (docs/adr/0028).",
        ),
    ] = 2,
    hosted_ranks: Annotated[
        bool,
        typer.Option(
            "--hosted-ranks/--no-hosted-ranks",
            envvar="TRAINHUB_HOSTED_RANKS",
            help="Run CPU ranks in one long-lived Ray actor per node (it holds no slot) "
            "instead of starting an actor, a Ray worker process, for each rank "
            "(docs/adr/0031).",
        ),
    ] = True,
    session_relay: Annotated[
        SessionRelay,
        typer.Option(
            envvar="TRAINHUB_SESSION_RELAY",
            help="How the proxy reaches a session's server: 'auto' through its socket on "
            "this host's Ray node and through its rank actor's relay on other nodes; "
            "'always' through the relay (docs/adr/0041).",
        ),
    ] = SessionRelay.AUTO,
) -> None:
    """Run the control plane (API and scheduler) until interrupted.

    On its first start it creates the user 'admin' and prints an admin token (also saved to
    HOME/admin-token). Stopping it (Ctrl-C) leaves running trials and the local Ray head
    alive, and a new start takes them over; `trainhub server stop` ends all of it.
    """
    if ctx.invoked_subcommand is not None:
        return
    from trainhub.cli.session import fail
    from trainhub.server import Settings, serve

    settings = Settings(
        db_url=db,
        storage=Path(storage).expanduser().resolve()
        if storage and not storage.startswith("s3://")
        else None,
        storage_url=storage if storage and storage.startswith("s3://") else None,
        s3_endpoint=s3_endpoint,
        rank_storage=rank_storage.value,
        ray_address=ray_address,
        ray_namespace=ray_namespace,
        host=host,
        port=port,
        advertise_url=advertise_url,
        ray_num_cpus=num_cpus,
        ray_num_gpus=num_gpus,
        tick_interval_s=tick_interval_s,
        sandbox=sandbox.value,
        data_dir=data_dir.expanduser().resolve() if data_dir else None,
        dataset_cache_gb=dataset_cache_gb,
        monitor_interval_s=monitor_interval_s,
        env_cache=env_cache.expanduser().resolve() if env_cache else None,
        env_cache_gb=env_cache_gb,
        env_build=env_build.value,
        pids_per_rank=pids_per_rank,
        warm_pool_size=warm_pool_size,
        hosted_ranks=hosted_ranks,
        session_relay=session_relay.value,
    )
    if home is not None:
        settings = dataclasses.replace(settings, home=home.expanduser().resolve())
    # options left unset keep the Settings defaults
    if policy is not None:
        settings = dataclasses.replace(settings, policy=policy.value)
    if min_run_time_s is not None:
        settings = dataclasses.replace(settings, min_run_time_s=min_run_time_s)
    if preemption_cooldown_s is not None:
        settings = dataclasses.replace(settings, preemption_cooldown_s=preemption_cooldown_s)
    if usage_half_life_s is not None:
        settings = dataclasses.replace(settings, usage_half_life_s=usage_half_life_s)
    if reclaim_patience is not None:
        settings = dataclasses.replace(settings, reclaim_patience=reclaim_patience)
    if reclaim_rate is not None:
        settings = dataclasses.replace(settings, reclaim_rate=reclaim_rate)
    if max_log_mb_per_trial is not None:
        settings = dataclasses.replace(
            settings, max_log_bytes_per_trial=int(max_log_mb_per_trial * 1024**2)
        )
    if max_metric_points_per_minute is not None:
        settings = dataclasses.replace(
            settings, max_metric_points_per_minute=max_metric_points_per_minute
        )
    if max_metric_points_per_trial is not None:
        settings = dataclasses.replace(
            settings, max_metric_points_per_trial=max_metric_points_per_trial
        )
    from sqlalchemy.exc import OperationalError

    from trainhub.adapters.sandbox import SandboxUnavailable
    from trainhub.core.errors import StorageUnavailable

    try:
        serve(settings)
    except SandboxUnavailable as exc:  # e.g. the database inside the Python environment
        raise fail(f"cannot start: {exc}", code=2) from None
    except OperationalError as exc:
        raise fail(
            f"cannot open the database {_redact(settings.database_url)}: {exc.orig or exc}",
            "check --db (postgresql://USER:PASSWORD@HOST:PORT/DB) and that the server runs",
        ) from None
    except StorageUnavailable as exc:
        raise fail(exc.message, exc.hint) from None
    except KeyboardInterrupt:
        pass


@server_app.command("stop")
def server_stop(
    home: Annotated[
        Path | None,
        typer.Option(envvar="TRAINHUB_HOME", help="State directory; default: ~/.trainhub."),
    ] = None,
) -> None:
    """End what `trainhub server` started for HOME: the server and its local Ray head.

    The trials still running on that head end too (their processes are killed)."""
    from trainhub.server import default_home, stop_server

    stopped = stop_server(home.expanduser().resolve() if home else default_home())
    typer.echo("stopped: " + "; ".join(stopped) if stopped else "nothing was running")


def _redact(url: str) -> str:
    """``postgresql://u:secret@h/db`` -> ``postgresql://u:***@h/db``."""
    return re.sub(r"(://[^:/@]+:)[^/]*@", r"\1***@", url)


def _mount_sim() -> None:
    """``trainhub sim`` comes from trainhub.cli.sim when that module exists."""
    if importlib.util.find_spec("trainhub.cli.sim") is None:
        return
    try:
        sim = importlib.import_module("trainhub.cli.sim")
    except ImportError as exc:
        reason = str(exc)

        @app.command("sim", rich_help_panel="Control plane")
        def sim_unavailable() -> None:
            """The cluster simulator (unavailable here)."""
            from trainhub.cli.session import fail

            raise fail(f"trainhub sim cannot load: {reason}")

        return
    app.add_typer(sim.app, name="sim", rich_help_panel="Control plane")


_mount_sim()


if __name__ == "__main__":
    app()
