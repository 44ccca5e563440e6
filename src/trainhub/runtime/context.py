"""``trainhub.init()`` and the :class:`Context` a training script works with."""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import operator
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, SupportsIndex, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainhub.runtime import protocol
from trainhub.runtime.checkpoints import (
    BaseCheckpointStore,
    CheckpointHandle,
    LocalCheckpointStore,
    RemoteCheckpointStore,
)
from trainhub.runtime.data import make_data_loader, set_loader_epoch
from trainhub.runtime.environment import LaunchEnv
from trainhub.runtime.errors import exit_on_refused_spec, refusing_the_spec
from trainhub.runtime.metrics import (
    BaseMetricsSink,
    LocalMetricsSink,
    NullMetricsSink,
    RemoteMetricsSink,
    coerce_metrics,
    make_point,
)
from trainhub.runtime.model import BaseCommStrategy
from trainhub.runtime.options import RuntimeOptions
from trainhub.runtime.process_group import (
    agree_on_stop,
    ensure_process_group,
    select_device,
)
from trainhub.runtime.signals import SignalPoller
from trainhub.runtime.startup import StartupMarks
from trainhub.runtime.transport import Backoff, ControlPlaneClient

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from trainhub.runtime.distill import Distiller
    from trainhub.runtime.distributed import DistributedConfig, PreparedModel, StepTimer
    from trainhub.runtime.distributed.parallel import LossFn, ParallelModel
    from trainhub.runtime.init_model import InitReport
    from trainhub.runtime.layer_watch import LayerWatch
    from trainhub.runtime.profiling import RankProfiler
    from trainhub.runtime.sample_tracking import SampleTracker

logger = logging.getLogger("trainhub.runtime")

T = TypeVar("T")
# how long a checkpoint's upload waits for the metrics reported before it (then goes anyway:
# the points stay queued and are retried)
METRICS_BEFORE_CHECKPOINT_S = 30.0

_current: Context | None = None
_current_lock = threading.Lock()


def init(
    hparams: Mapping[str, Any] | None = None,
    *,
    metrics_file: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    flush_timeout_s: float | None = None,
    options: RuntimeOptions | None = None,
) -> Context:
    """Start the trainhub runtime in this process; call it once, on every rank, first thing.

    Reads the launch environment (torchrun's ``RANK``/``WORLD_SIZE``/... and the ``TRAINHUB_*``
    variables the executor sets). When ``WORLD_SIZE > 1`` and ``torch.distributed`` is not yet
    initialised, joins the process group (``env://``; NCCL when this rank has a GPU, else gloo)
    and selects the GPU of ``LOCAL_RANK``; this blocks until every rank has called ``init``.

    Without ``TRAINHUB_API_URL`` the script runs standalone: metrics go to stdout and a local
    JSON-lines file, checkpoints to a local directory, and ``should_stop()`` is always False.

    A second call while the first context is open returns that context (its arguments ignored).

    Args:
        hparams: Default hyperparameters; the trial's ``TRAINHUB_HPARAMS`` override them.
        metrics_file: Standalone: where metric lines are appended
            (default ``./trainhub-metrics.jsonl``).
        checkpoint_dir: Standalone: where ``step-N.pt`` files go (default ``./checkpoints``).
        flush_timeout_s: How long ``close()`` keeps retrying undelivered metrics and checkpoint
            uploads while the control plane is unreachable (default 600).
        options: All tuning knobs at once (the environment's overrides are then ignored).

    Returns:
        The context of this rank.

    Example:
        >>> import trainhub
        >>> ctx = trainhub.init(hparams={"lr": 0.01, "epochs": 10})  # doctest: +SKIP
        >>> ctx.hparams["lr"], ctx.rank, ctx.world_size  # doctest: +SKIP
        (0.01, 0, 1)
    """
    global _current  # noqa: PLW0603 (one runtime per process)
    with _current_lock:
        if _current is not None and not _current.closed:
            return _current
        env = LaunchEnv.from_env()
        base = options if options is not None else RuntimeOptions.from_env()
        resolved = base.replace(
            metrics_file=metrics_file,
            checkpoint_dir=checkpoint_dir,
            flush_timeout_s=flush_timeout_s,
        )
        # absolute now, so a later chdir in the script does not move them
        resolved = resolved.replace(
            metrics_file=resolved.metrics_file.resolve(),
            checkpoint_dir=resolved.checkpoint_dir.resolve(),
        )
        _current = Context(env, resolved, {**(hparams or {}), **env.hparams})
        return _current


class Context:
    """One rank's handle on the runtime; made by :func:`trainhub.init`.

    Methods that ship data (``report``, ``set_progress``, ``save_checkpoint``) act on rank 0 and
    are no-ops elsewhere, so every rank may call them. ``should_stop`` is a collective: every
    rank must call it at the same point. ``restore`` is meant for every rank.

    Example:
        >>> ctx = trainhub.init()  # doctest: +SKIP
        >>> with ctx:  # close() at the end flushes metrics and uploads  # doctest: +SKIP
        ...     for epoch in range(ctx.hparams["epochs"]):
        ...         ctx.report(step=epoch, loss=train_one_epoch())
    """

    def __init__(self, env: LaunchEnv, options: RuntimeOptions, hparams: dict[str, Any]) -> None:
        self._env = env
        self._options = options
        self._hparams = hparams
        self._startup = _startup_marks(env)
        self._device = select_device(env.local_rank, env.local_world_size)
        self._owns_process_group = ensure_process_group(
            rank=env.rank, world_size=env.world_size, device=self._device
        )
        if env.world_size > 1 and dist.get_world_size() != env.world_size:
            raise ValueError(
                f"WORLD_SIZE={env.world_size} but the existing process group has "
                f"{dist.get_world_size()} ranks"
            )
        self._startup.process_group_ready()
        self._stopped = False
        self._stop_reason: str | None = None
        self._prepared: PreparedModel | None = None
        self._parallel: ParallelModel | None = None
        self._batch_size: int | None = None
        self._optimizers: list[torch.optim.Optimizer] = []
        self._poller: SignalPoller | None = None
        # a report held the searcher's metric: the next should_stop() waits for its reply
        self._stop_check_due = False
        self._sample_tracker: SampleTracker | None = None
        self._spool_dir: Path | None = None  # node-local scratch of a managed attempt
        self._rank_profiler: RankProfiler | bool | None = False  # False: not looked up yet
        self._watches: list[LayerWatch] = []
        self._closed = False
        self._closing = False
        self._close_lock = threading.Lock()
        self._close_result = True
        self._metrics: BaseMetricsSink
        self._checkpoints: BaseCheckpointStore
        if env.api_url is not None and env.trial_id is not None:
            self._setup_managed(env.api_url, env.trial_id)
        else:
            self._metrics = (
                LocalMetricsSink(options.metrics_file) if self.is_chief else NullMetricsSink()
            )
            self._checkpoints = LocalCheckpointStore(options.checkpoint_dir)
        self._previous_sigterm: Any = None
        self._previous_excepthook: Any = sys.excepthook
        self._install_exit_hooks()

    def _setup_managed(self, api_url: str, trial_id: int) -> None:
        env, options = self._env, self._options

        def client() -> ControlPlaneClient:
            return ControlPlaneClient(api_url, env.token, trial_id, options.request_timeout_s)

        def backoff() -> Backoff:
            return Backoff(options.retry_initial_s, options.retry_max_s)

        spool = env.spool_dir or Path(tempfile.mkdtemp(prefix=f"trainhub-trial-{trial_id}-"))
        self._spool_dir = spool
        if self.is_chief:
            poller = SignalPoller(client, poll_s=options.signals_poll_s)
            self._metrics = RemoteMetricsSink(
                client,
                attempt=env.attempt,
                batch_s=options.metrics_batch_s,
                batch_max_points=options.metrics_batch_max_points,
                backoff=backoff(),
                spill_path=spool / "undelivered-metrics.jsonl",
                on_signals=poller.offer,
            )
            self._poller = poller
        else:
            self._metrics = NullMetricsSink()
        self._checkpoints = RemoteCheckpointStore(
            client,
            spool_dir=spool,
            attempt=env.attempt,
            restore_checkpoint_id=env.restore_checkpoint_id,
            backoff_factory=backoff,
            restore_timeout_s=options.flush_timeout_s,
            # the metrics reported before a save land before the checkpoint is registered
            before_upload=lambda: self._metrics.flush(METRICS_BEFORE_CHECKPOINT_S),
        )

    def __repr__(self) -> str:
        mode = f"trial {self.trial_id}" if self.managed else "standalone"
        return f"Context(rank={self.rank}/{self.world_size}, device={self.device}, {mode})"

    # --- who and where ---

    @property
    def rank(self) -> int:
        """Global rank of this process, 0 to ``world_size - 1``."""
        return self._env.rank

    @property
    def local_rank(self) -> int:
        """Rank among the processes of this node."""
        return self._env.local_rank

    @property
    def world_size(self) -> int:
        """Number of ranks of the trial."""
        return self._env.world_size

    @property
    def is_chief(self) -> bool:
        """True on rank 0, the rank that reports metrics and writes checkpoints."""
        return self._env.rank == 0

    @property
    def device(self) -> torch.device:
        """This rank's GPU (``cuda:N``) if it has one, else ``cpu``."""
        return self._device

    @property
    def hparams(self) -> dict[str, Any]:
        """Hyperparameters: the defaults given to ``init`` overridden by the trial's."""
        return self._hparams

    @property
    def trial_id(self) -> int | None:
        """The trial this run belongs to; None standalone."""
        return self._env.trial_id

    @property
    def experiment_id(self) -> int | None:
        return self._env.experiment_id

    @property
    def attempt(self) -> int:
        """1 for the first run of the trial, 2 after the first restart, ..."""
        return self._env.attempt

    @property
    def managed(self) -> bool:
        """True when launched by the control plane, False standalone."""
        return self._env.managed

    @property
    def distributed_config(self) -> Mapping[str, Any] | None:
        """The spec's ``distributed`` section (``TRAINHUB_DISTRIBUTED``), if any."""
        return self._env.distributed

    @property
    def stop_reason(self) -> str | None:
        """Why ``should_stop()`` returned True (e.g. "preempted"); None until it did."""
        return self._stop_reason

    @property
    def closed(self) -> bool:
        return self._closed

    # --- model and data ---

    def prepare_model(
        self, model: nn.Module, *, strategy: BaseCommStrategy | None = None
    ) -> nn.Module:
        """Move ``model`` to this rank's device and apply the spec's ``distributed`` section.

        Every rank calls it with the same architecture. With several ranks the model is wrapped
        for the configured strategy (``allreduce``: DDP; ``fp16``/``bf16``/``powersgd``/
        ``onebit``/``topk``/``localsgd``: DDP with that communication hook; ``ps``: parameter
        shards served by the trial's ranks), plus activation checkpointing or FSDP when asked.
        Then call :meth:`prepare_optimizer` on your optimizer (large-batch options, local SGD
        and ``ps`` need it) and use :meth:`autocast` / :meth:`backward` / :meth:`step` for mixed
        precision. Save ``trainhub.runtime.unwrap_model(model).state_dict()``.

        Args:
            model: The user's module.
            strategy: Replace the spec's strategy with one of your own (a
                :class:`~trainhub.runtime.model.BaseCommStrategy`); the section's memory and
                large-batch options still apply.

        Example:
            >>> model = ctx.prepare_model(LeNet())  # doctest: +SKIP
            >>> optimizer = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        """
        from trainhub.runtime.distributed import apply_strategy

        self._prepared = apply_strategy(
            model, self.distributed, device=self._device, strategy=strategy
        )
        return self._prepared.model

    def parallelize(
        self,
        model: nn.Module,
        *,
        loss_fn: LossFn,
        split_points: Sequence[str] | None = None,
        tp_plan: Mapping[str, Any] | None = None,
    ) -> ParallelModel:
        """Split ``model`` over the ranks as the spec's ``distributed.pipeline`` and
        ``distributed.tensor`` say (docs/distributed.md, "Models bigger than one GPU").

        Builds the ``(dp, pp, tp)`` device mesh, keeps this rank's pipeline stage (at
        ``split_points`` or the spec's, else of about equal parameter count), shards the
        tensor plan's Linear layers (``tp_plan`` or the model's ``tensor_parallel_plan()``) and
        wraps the stage in the spec's schedule (GPipe or 1F1B). Every rank calls it with the
        same model and weights (seed before building it). Then::

            optimizer = ctx.prepare_optimizer(torch.optim.AdamW(par.parameters()))
            loss = par.step(x, y)          # forward + backward of the batch, every rank
            optimizer.step(); optimizer.zero_grad()
            ctx.save_checkpoint({**par.state_dict(optimizer), "step": step}, step=step)

        ``ctx.restore()`` then loads a checkpoint of any layout into the stage and the
        optimizer. A spec the model cannot honour raises
        :class:`~trainhub.runtime.errors.SpecRefused` (the trial is not restarted).
        """
        from trainhub.runtime.distributed.parallel import parallelize

        with refusing_the_spec():
            config = self.distributed
        self._parallel = parallelize(
            model,
            config,
            device=self._device,
            loss_fn=loss_fn,
            split_points=split_points,
            tp_plan=tp_plan,
        )
        return self._parallel

    @property
    def parallel(self) -> ParallelModel | None:
        """What :meth:`parallelize` built, if it was called."""
        return self._parallel

    @property
    def distributed(self) -> DistributedConfig:
        """The parsed ``distributed`` section of the spec (defaults when there is none)."""
        from trainhub.runtime.distributed import DistributedConfig

        return DistributedConfig.from_mapping(self._env.distributed or {})

    @property
    def prepared(self) -> PreparedModel | None:
        """What :meth:`prepare_model` built: meter, precision, averager, optimizer helpers."""
        return self._prepared

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, *, per_rank_batch_size: int | None = None
    ) -> torch.optim.Optimizer:
        """The optimizer every rank must step under the spec (every rank calls it).

        Applies ``distributed.large_batch``: ``optimizer: lars``/``lamb`` replace ``optimizer``
        by LARS/LAMB over the same parameter groups (lr, momentum or betas, weight decay carry
        over); ``lr_scaling: linear`` multiplies each group's lr by ``global batch /
        reference_batch_size`` (global batch = ``per_rank_batch_size`` x world size x
        ``accumulation_steps``) and ramps it up from the base lr over ``warmup_steps`` steps.
        Then the strategy's wrapping: ``localsgd`` adds periodic model averaging after the step;
        ``ps`` pushes gradients to the shards and pulls weights.

        Args:
            optimizer: Built over the prepared model's parameters.
            per_rank_batch_size: For linear lr scaling; default: the batch size of the last
                :meth:`prepare_data_loader`.

        Example:
            >>> loader = ctx.prepare_data_loader(train_set, batch_size=64)  # doctest: +SKIP
            >>> opt = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        """
        from trainhub.runtime.distributed.large_batch import apply_large_batch

        spec = self.distributed.large_batch
        batch = per_rank_batch_size if per_rank_batch_size is not None else self._batch_size
        global_batch = None
        if batch is not None:
            # under pipeline/tensor parallelism a batch is shared by the ranks of a replica
            replicas = self._parallel.layout.dp if self._parallel is not None else self.world_size
            global_batch = batch * replicas * spec.accumulation_steps
        optimizer = apply_large_batch(
            optimizer,
            optimizer_kind=spec.optimizer,
            lr_scaling=spec.lr_scaling,
            reference_batch_size=spec.reference_batch_size,
            warmup_steps=spec.warmup_steps,
            global_batch_size=global_batch,
        )
        self._optimizers.append(optimizer)
        if self._prepared is None:
            return optimizer
        return self._prepared.wrap_optimizer(optimizer)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Run the forward pass in the spec's precision (``memory.precision``): bf16 autocast
        on CPU and GPU, fp16 with a gradient scaler on GPU; a no-op for fp32."""
        if self._prepared is None:
            yield
            return
        with self._prepared.precision.autocast():
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled when the precision is fp16 (use with :meth:`step`)."""
        if self._prepared is None:
            loss.backward()  # type: ignore[no-untyped-call]
        else:
            self._prepared.precision.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``, unscaling and skipping overflowed steps under fp16."""
        if self._prepared is None:
            optimizer.step()
        else:
            self._prepared.precision.step(optimizer)

    def step_timer(self, report_every_steps: int | None = None) -> StepTimer:
        """A :class:`~trainhub.runtime.distributed.StepTimer` bound to the prepared model's
        communication meter: where each step's time goes (data, forward, backward, waiting for
        communication, optimizer), bytes per step and samples/s. Report ``timer.summary()``
        with :meth:`report`; ``trainhub show`` prints it as a table."""
        from trainhub.runtime.distributed import StepTimer

        meter = self._prepared.meter if self._prepared is not None else None
        return StepTimer(
            meter=meter,
            device=self._device,
            report_every_steps=report_every_steps,
            parallel=self._parallel,
        )

    def prepare_data_loader(
        self, dataset: Dataset[T], batch_size: int, shuffle: bool = True, **kwargs: Any
    ) -> DataLoader[T]:
        """A DataLoader over this rank's shard of ``dataset`` (all of it when world size is 1).

        With several ranks each gets a disjoint ``1/world_size`` of the samples per epoch (a
        DistributedSampler; the last shard is padded with repeats so every rank runs as many
        steps). Call :meth:`set_epoch` at the start of each epoch so the shuffle differs.

        Args:
            dataset: A map-style dataset, the same on every rank.
            batch_size: Per-rank batch size (the global batch is ``world_size`` times larger).
            shuffle: Shuffle each epoch.
            **kwargs: Passed to ``torch.utils.data.DataLoader`` (``num_workers``, ...).

        Example:
            >>> loader = ctx.prepare_data_loader(train_set, batch_size=64)  # doctest: +SKIP
            >>> for epoch in range(10):  # doctest: +SKIP
            ...     ctx.set_epoch(loader, epoch)
        """
        # the shuffle must be the same permutation on every rank: seed it from the trial
        seed = self._hparams.get("seed", 0)
        self._batch_size = batch_size
        # under pipeline/tensor parallelism the ranks of one model replica read the same batch
        rank, world = (
            self._parallel.data_rank()
            if self._parallel is not None
            else (self.rank, self.world_size)
        )
        return make_data_loader(
            dataset,
            batch_size,
            shuffle=shuffle,
            rank=rank,
            world_size=world,
            seed=seed if isinstance(seed, int) else 0,
            **kwargs,
        )

    def set_epoch(self, loader: DataLoader[Any], epoch: int) -> None:
        """Reshuffle a loader from :meth:`prepare_data_loader` for ``epoch`` (every rank)."""
        set_loader_epoch(loader, epoch)

    # --- metrics ---

    def report(self, *, step: int, **metrics: object) -> None:
        """Record metrics of ``step``; rank 0 ships them, other ranks ignore the call.

        Values may be Python or NumPy numbers or one-element tensors; they become floats. The
        call never waits on the network: points are batched (every second or 100 points) and
        sent by a background thread, retried while the control plane is unreachable, and
        flushed by ``close()`` (also at exit and on SIGTERM). Reporting a step again replaces
        its values, so re-reporting after a restore is fine. Standalone: one JSON line on
        stdout, appended to the metrics file.

        Args:
            step: Position in training (epoch or batch number), an int >= 0.
            **metrics: Metric names and values, e.g. ``train_loss=loss``.

        Example:
            >>> ctx.report(step=epoch, train_loss=loss, val_accuracy=0.97)  # doctest: +SKIP
        """
        if not self.is_chief:
            return
        self._raise_over_quota()
        step = _as_step(step)
        if not metrics:
            raise ValueError(
                "report() needs at least one metric, e.g. ctx.report(step=3, loss=0.1)"
            )
        self._metrics.add(make_point(step, coerce_metrics(metrics)))
        if self._env.searcher_metric is not None and self._env.searcher_metric in metrics:
            self._stop_check_due = True

    def _raise_over_quota(self) -> None:
        """Raise QuotaExceeded once the control plane refused a report or an upload because
        the trial passed its storage quota (the message has the numbers)."""
        refusal = self._metrics.quota_refusal or self._checkpoints.quota_refusal
        if refusal:
            from trainhub.runtime.errors import QuotaExceeded

            raise QuotaExceeded(refusal)

    def set_progress(
        self, current: float, total: float | None = None, unit: str = "epochs"
    ) -> None:
        """Tell the control plane how far training is (rank 0; sent with the next batch).

        Example:
            >>> ctx.set_progress(epoch + 1, total=epochs)  # doctest: +SKIP
        """
        if not self.is_chief:
            return
        progress: protocol.Progress = {
            "current": float(current),
            "total": None if total is None else float(total),
            "unit": str(unit),
        }
        self._metrics.set_progress(progress)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Send pending metrics now and wait up to ``timeout_s``; True if all were delivered."""
        timeout = self._options.flush_timeout_s if timeout_s is None else timeout_s
        return self._metrics.flush(timeout)

    # --- checkpoints ---

    def save_checkpoint(
        self, state: Mapping[str, Any], step: int, metrics: Mapping[str, object] | None = None
    ) -> CheckpointHandle | None:
        """Save training state; every rank calls it, rank 0 alone writes.

        Under ``localsgd`` it is a collective (every rank must call it at the same step): the
        replicas are averaged first, so the checkpoint holds their average, not rank 0's
        replica. Other strategies keep equal replicas and need no communication here.

        Rank 0 writes ``torch.save(state)`` before returning (training may then change its
        tensors); in managed mode the file is uploaded in the background, retried while the
        control plane is unreachable, and ``close()`` waits for the upload. Other ranks return
        None at once and write nothing. Standalone: ``./checkpoints/step-N.pt``.

        Args:
            state: What to save, e.g. ``{"model": ..., "optimizer": ..., "epoch": epoch}``.
            step: The step this state belongs to.
            metrics: Values that rank this checkpoint (the searcher metric), e.g.
                ``{"val_accuracy": 0.97}``.

        Returns:
            On rank 0 a :class:`CheckpointHandle` (``handle.wait()`` blocks until registered;
            ``handle.id`` is then the control plane's id); None on other ranks. Under
            ``memory.fsdp`` with a control plane every rank uploads its own shards (ADR 0040)
            and gets the handle of its own upload; the checkpoint is registered once every
            rank's is stored (``handle.id`` is set on the rank whose upload completed it).

        Example:
            >>> ctx.save_checkpoint({"model": model.state_dict(), "epoch": epoch}, step=epoch,
            ...                     metrics={"val_accuracy": acc})  # doctest: +SKIP
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"save_checkpoint() takes a dict of state, got {type(state).__name__}")
        if self._prepared is not None and self.world_size > 1:
            # local SGD: replicas differ between averagings; save their average, not rank 0's
            # (``state`` holds views of the parameters, so it sees the averaged values)
            self._prepared.average_replicas()
            if self._prepared.is_fsdp and isinstance(self._checkpoints, RemoteCheckpointStore):
                # one object per rank's file, each rank uploading its own (ADR 0040)
                self._raise_over_quota()
                step = _as_step(step)
                values = {
                    k: v for k, v in coerce_metrics(metrics or {}).items() if math.isfinite(v)
                }
                handle = self._checkpoints.save_shards(
                    state, step, values, rank=self.rank, world_size=self.world_size
                )
                return handle
            if self._prepared.is_fsdp:
                from trainhub.runtime.distributed.sharded_checkpoint import pack_sharded

                packed = pack_sharded(state)  # every rank writes its own shards
                if packed is None:
                    return None
                state = packed
        if self._parallel is not None and self.world_size > 1:
            from trainhub.runtime.distributed.sharded_checkpoint import pack_sharded

            packed = pack_sharded(state)  # a collective: every rank writes its stage's shards
            if packed is None:
                return None
            state = packed
        if not self.is_chief:
            return None
        self._raise_over_quota()
        step = _as_step(step)
        values = {k: v for k, v in coerce_metrics(metrics or {}).items() if math.isfinite(v)}
        return self._checkpoints.save(state, step, values)

    def restore(self, *, weights_only: bool = True) -> dict[str, Any] | None:
        """The state to resume from, loaded onto :attr:`device`; None for a fresh start.

        Managed: the checkpoint the control plane named (``TRAINHUB_RESTORE_CHECKPOINT``),
        downloaded once per node into the spool directory (ranks on other machines download
        their own copy). Standalone: the highest ``./checkpoints/step-N.pt``. Every rank calls
        it and gets the same state.

        Args:
            weights_only: ``torch.load``'s safe mode (tensors, dicts, lists, numbers, strings);
                pass False for checkpoints holding other Python objects you trust.

        Example:
            >>> state = ctx.restore()  # doctest: +SKIP
            >>> start = state["epoch"] + 1 if state else 0  # doctest: +SKIP
        """
        if self.world_size > 1 and isinstance(self._checkpoints, RemoteCheckpointStore):
            sharded = self._checkpoints.load_shards(
                self._device,
                weights_only=weights_only,
                rank=self.rank,
                world_size=self.world_size,
                model=self._prepared.module if self._prepared is not None else None,
                optimizers=self._optimizers,
            )
            if sharded is not None:
                return sharded
        state = self._checkpoints.load(self._device, weights_only=weights_only)
        from trainhub.runtime.distributed.sharded_checkpoint import (
            is_packed,
            restore_parallel,
            unpack_sharded,
        )

        if state is not None and is_packed(state) and self._parallel is not None:
            return restore_parallel(state, self._parallel, self._optimizers)
        if state is not None and self._parallel is not None and "model" in state:
            # one process: the state is whole, load it as restore_parallel would have
            optimizer = self._optimizers[-1] if self._optimizers else None
            self._parallel.load_state_dict(state, optimizer)
        if state is not None and is_packed(state):
            model = self._prepared.module if self._prepared is not None else None
            state = unpack_sharded(
                state, model=model, optimizers=self._optimizers, weights_only=weights_only
            )
        return state

    # --- stopping ---

    def should_stop(self) -> bool:
        """True when the trial should save a checkpoint and exit (pruned, preempted, canceled).

        A collective: with several ranks, every rank must call it at the same point (e.g. once
        per epoch or every N steps); rank 0's answer from the control plane is shared with an
        all-reduce, so all ranks get the same answer at the same step. Stop requests ride on the
        replies to rank 0's metric reports (and on a background poll every few seconds), so the
        call does not wait on the network, with one exception: in a search, the first call after
        a ``report()`` of the searcher's metric sends that report now and waits for its reply
        (a few milliseconds; at most ``stop_check_timeout_s``, and not at all while the control
        plane is unreachable), so a prune decided on that value stops the trial at this step,
        not one epoch later.
        Once True it stays True; :attr:`stop_reason` says why. Standalone: always False.

        Example:
            >>> if ctx.should_stop():  # doctest: +SKIP
            ...     ctx.save_checkpoint(state, step=epoch)
            ...     break
        """
        if self._stopped:
            return True
        local_stop, reason = False, None
        if self._poller is not None:
            if self._stop_check_due:
                self._stop_check_due = False
                # while the control plane is away, training does not wait on it
                if self._metrics.reachable:
                    self._metrics.flush(self._options.stop_check_timeout_s)
            signal_now = self._poller.current()
            local_stop, reason = signal_now.should_stop, signal_now.reason
        if self.managed and self.world_size > 1:
            local_stop, reason = agree_on_stop(local_stop, reason, self._device)
        if local_stop:
            self._stopped = True
            self._stop_reason = reason or "stop requested by the control plane"
        return local_stop

    # --- shutdown ---

    def close(self, timeout_s: float | None = None) -> bool:
        """Deliver pending metrics and checkpoint uploads, then release the runtime.

        Keeps retrying while the control plane is unreachable, for at most ``timeout_s``
        (default: the ``flush_timeout_s`` of ``init``). Also runs at interpreter exit and on
        SIGTERM. Destroys the process group if ``init`` created it. Calling it again does
        nothing. Every rank may call it; only rank 0 has anything to deliver.

        Returns:
            True if everything was delivered.
        """
        return self._close(timeout_s, from_exit=False)

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _close(self, timeout_s: float | None, *, from_exit: bool) -> bool:
        with self._close_lock:
            if self._closed or self._closing:
                return self._close_result
            self._closing = True
        timeout = self._options.flush_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        try:
            for watch in self._watches:  # their last samples, as metrics, before the flush
                try:
                    watch.flush()
                except Exception:  # a broken watch must not cost the other metrics
                    logger.exception("trainhub: a layer watch could not ship its last sample")
            self._startup.close()
            samples_delivered = (
                self._sample_tracker.close(timeout) if self._sample_tracker is not None else True
            )
            self._metrics.begin_close(timeout)
            self._checkpoints.begin_close(timeout)
            delivered = self._metrics.finish_close()
            delivered = self._checkpoints.finish_close() and delivered and samples_delivered
            if self._poller is not None:
                self._poller.close()
            if self._prepared is not None and not from_exit:
                self._prepared.close()  # ps: stop the shards this rank serves
            if not delivered:
                logger.error(
                    "trainhub: some metrics or checkpoints were not delivered within %.0f s",
                    time.monotonic() - started,
                )
            self._close_result = delivered
        finally:
            self._closed = True
            self._remove_exit_hooks()
            if not from_exit and self._owns_process_group and dist.is_initialized():
                # a DDP reducer that outlives its process group can abort the process (-6)
                from trainhub.runtime.distributed.teardown import release_reducers

                release_reducers()
                dist.destroy_process_group()
        return self._close_result

    def _install_exit_hooks(self) -> None:
        atexit.register(self._close_at_exit)
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        if (
            not self._options.handle_sigterm
            or threading.current_thread() is not threading.main_thread()
        ):
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _remove_exit_hooks(self) -> None:
        atexit.unregister(self._close_at_exit)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        if (
            self._previous_sigterm is not None
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == self._on_sigterm
        ):
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def _excepthook(
        self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        self._previous_excepthook(exc_type, exc, tb)
        # a refused spec: deliver, then exit EXIT_SPEC_REFUSED so the trial is not restarted
        exit_on_refused_spec(exc_type, lambda: self._close(None, from_exit=True))

    def _close_at_exit(self) -> None:
        self._close(None, from_exit=True)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._closing:
            # already flushing on the way out: let it finish within its timeout
            return
        print(
            "trainhub: SIGTERM received; flushing metrics and checkpoints, then exiting",
            file=sys.stderr,
            flush=True,
        )
        # unwind the main thread (running finally blocks and releasing locks) and leave through
        # the atexit hook, which flushes; flushing right here could deadlock on a lock held by
        # the code this signal interrupted
        raise SystemExit(128 + signum)

    # --- training dynamics of samples (docs/debugging.md) ---

    def track_samples(
        self,
        ids: torch.Tensor,
        logits: torch.Tensor,
        labels: torch.Tensor,
        *,
        epoch: int | None = None,
        source: str | None = None,
    ) -> None:
        """Record each sample's margin, probability, loss and prediction for ``trainhub debug``.

        Call it on every rank after the forward pass of each training step; it never waits on
        the device or the network (records are shipped in batches, at epoch ends and exit).

        Args:
            ids: Sample ids of the batch (a dataset's ``with_ids()`` yields them).
            logits: The model's ``(batch, classes)`` output.
            labels: The labels trained with.
            epoch: The epoch (needed with several ranks); default: how often seen before.
            source: The dataset the ids index, e.g. ``splits.source`` (for image grids).

        Example:
            >>> for x, y, ids in loader:  # doctest: +SKIP
            ...     logits = model(x)
            ...     ctx.track_samples(ids, logits, y, epoch=epoch, source=splits.source)
        """
        from trainhub.runtime.sample_tracking import make_tracker

        if self._sample_tracker is None:
            env, options = self._env, self._options
            self._sample_tracker = make_tracker(
                device=self._device, rank=env.rank, attempt=env.attempt, api_url=env.api_url,
                token=env.token, trial_id=env.trial_id, request_timeout_s=options.request_timeout_s,
                retry_initial_s=options.retry_initial_s, retry_max_s=options.retry_max_s,
                flush_timeout_s=options.flush_timeout_s, local_dir=options.metrics_file.parent,
            )  # fmt: skip
        self._sample_tracker.track(ids, logits, labels, epoch=epoch, source=source)

    def distiller(
        self,
        student: nn.Module,
        teacher: nn.Module | None = None,
        *,
        weights: str | Path | bytes | Mapping[str, Any] | None = None,
        example_input: torch.Tensor | None = None,
        **settings: Any,
    ) -> Distiller:
        """A teacher for ``student``, on this rank: ``distiller.loss(x, logits, y)`` per batch.

        The spec's ``distill`` section names the teacher (fetched on every rank) and the
        temperature, alpha and hints; ``weights`` (a path or state dict) and ``settings``
        (``temperature``, ``alpha``, ``hints``, ``hint_weight``) override it. Add
        ``distiller.parameters()`` (the hint adapters) to the optimizer. Every rank calls it
        (after ``prepare_model``) and holds its own teacher in eval mode on its device; with
        hints and several ranks, ``distiller.loss`` is a collective like the backward. See
        :mod:`trainhub.runtime.distill` and docs/models.md.

        Example:
            >>> distiller = ctx.distiller(model, Teacher())  # doctest: +SKIP
            >>> loss = distiller.loss(x, model(x), y)  # doctest: +SKIP
        """
        from trainhub.distill_contract import DistillSpec
        from trainhub.runtime.distill import make_distiller

        with refusing_the_spec():
            return make_distiller(
                student,
                teacher,
                weights=weights,
                spec=DistillSpec.from_env(),
                api_url=self._env.api_url,
                token=self._env.token,
                trial_id=self._env.trial_id,
                device=self.device,
                example_input=example_input,
                **settings,
            )

    # --- layer health ---

    def watch(self, model: nn.Module, every: int = 100, **options: Any) -> LayerWatch:
        """Sample layer health (gradient and weight norms, update ratio, activation statistics,
        dead or saturated units, the first layer with NaN/Inf) every ``every`` training steps
        and report it as ``layers/<layer>/<statistic>`` metrics; the control plane raises
        alerts from them (``trainhub show``). Every rank may call it; rank 0 ships. Options:
        ``max_layers``, ``start_step`` (see :class:`~trainhub.runtime.layer_watch.LayerWatch`).

        Example:
            >>> watch = ctx.watch(model, every=50)  # doctest: +SKIP
            >>> watch.flush()  # ships the last sample now; close() does too  # doctest: +SKIP
        """
        from trainhub.runtime.layer_watch import LayerWatch

        watch = LayerWatch(
            model, every=every, report=lambda s, m: self.report(step=s, **m), **options
        )
        self._watches.append(watch)  # close() ships its last sample
        return watch

    def init_model(
        self,
        model: nn.Module,
        *,
        init_from: str | Path | Mapping[str, torch.Tensor] | None = None,
        freeze: Sequence[str] = (),
        reset: Sequence[str] = (),
        grow: Mapping[str, Any] | None = None,
    ) -> tuple[nn.Module, InitReport]:
        """Start ``model`` from the spec's ``model`` section: load weights of matching name
        and shape, grow (Net2Net), reset, freeze; every rank calls it, before
        ``prepare_model``. Arguments replace the spec's (standalone: ``init_from`` is a
        checkpoint path). Returns the (possibly grown) model and what was done
        (``trainhub.runtime.init_model``, docs/models.md).

        Example:
            >>> model, report = ctx.init_model(Net())  # doctest: +SKIP
        """
        from trainhub.runtime.init_model import ModelPlan, init_model

        with refusing_the_spec():
            spec = ModelPlan.from_env()
            plan = ModelPlan(
                init_from if init_from is not None else spec.init_from,
                tuple(freeze) or spec.freeze,
                tuple(reset) or spec.reset,
                grow if grow is not None else spec.grow,
            )
            return init_model(
                model,
                plan,
                device=self._device,
                api_url=self._env.api_url if init_from is None else None,
                token=self._env.token,
                trial_id=self._env.trial_id,
                spool=self._spool_dir,
            )

    # --- profiling (trainhub profile; runtime/profiling.py) ---

    def profile_step(self) -> None:
        """Mark the end of one training step, on every rank, so ``trainhub profile TRIAL``
        (or the dashboard's Profile button) can run torch.profiler over the next steps. Cheap
        while nothing is asked (a background thread polls); standalone it does nothing."""
        if self._rank_profiler is False:
            from trainhub.runtime.profiling import profiler_for

            env = self._env
            self._rank_profiler = profiler_for(
                env.api_url, env.token, env.trial_id, env.rank, self._device
            )
        if isinstance(self._rank_profiler, bool) or self._rank_profiler is None:
            return
        self._rank_profiler.step()


def _as_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, SupportsIndex):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    value = operator.index(step)
    if value < 0:
        raise ValueError(f"step must be >= 0, got {value}")
    return value


def _startup_marks(env: LaunchEnv) -> StartupMarks:
    """Rank 0 of a managed trial sends its startup marks; other ranks only keep them."""
    send = None
    if env.rank == 0 and env.api_url is not None and env.trial_id is not None:
        api_url, trial_id, token = env.api_url, env.trial_id, env.token

        def send(report: protocol.StartupReport) -> None:
            client = ControlPlaneClient(api_url, token, trial_id, timeout_s=5.0)
            try:
                client.post_startup(report)
            finally:
                client.close()

    return StartupMarks(env.attempt, send, os.environ.get(protocol.ENV_STARTUP_MARKS))
