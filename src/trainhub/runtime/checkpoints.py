"""Saving and restoring training state: to the control plane or to a local directory.

Managed mode (:class:`RemoteCheckpointStore`): ``save`` writes the state with ``torch.save`` into
the node-local spool directory at once (so training may go on changing its tensors) and queues
the file for upload; a background thread uploads it with the same retry rule as metrics. Each
checkpoint carries a uuid chosen here, so an upload retried after an unknown outcome registers
one checkpoint, not two. ``restore`` downloads the checkpoint the executor named, once per node
(ranks of a node share the spool directory and take turns through a file lock).

Standalone mode (:class:`LocalCheckpointStore`): ``checkpoints/step-N.pt`` and the latest of them.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import math
import os
import re
import shutil
import sys
import threading
import time
import uuid as uuid_lib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch

from trainhub.runtime import protocol
from trainhub.runtime.transport import (
    Backoff,
    ControlPlaneClient,
    ControlPlaneError,
    DeadlineExceeded,
    Waker,
    retry_transient,
)

logger = logging.getLogger("trainhub.runtime")

_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


class CheckpointHandle:
    """A checkpoint saved by rank 0; in managed mode its upload may still be under way.

    Attributes:
        uuid: Chosen by the runtime; the control plane registers an upload once per uuid.
        step: The step given to ``save_checkpoint``.
        path: The local file (standalone: the checkpoint itself; managed: the spool copy, which
            is deleted once uploaded).
    """

    def __init__(self, uuid: str, step: int, path: Path) -> None:
        self.uuid = uuid
        self.step = step
        self.path = path
        # a sharded checkpoint (ADR 0040): this rank's files in ``path`` (a folder), and
        # the set's shape; None for a one-file checkpoint
        self.shard: tuple[int, int] | None = None  # (rank, world size)
        self.files: list[str] = []  # this rank's files of the set, as written
        self._stored: dict[str, tuple[int, str]] = {}  # files stored: name -> (size, sha256)
        self._record: protocol.CheckpointRecord | None = None
        self._error: str | None = None
        self._settled = threading.Event()

    def __repr__(self) -> str:
        state = "done" if self.done else ("failed" if self._error else "pending")
        return f"CheckpointHandle(step={self.step}, uuid={self.uuid!r}, id={self.id}, {state})"

    @property
    def id(self) -> int | None:
        """The control plane's id once registered; ``None`` before that and in standalone mode."""
        return None if self._record is None else self._record["id"]

    @property
    def done(self) -> bool:
        """Saved for good: uploaded and registered (managed) or written (standalone)."""
        return self._settled.is_set() and self._error is None

    @property
    def error(self) -> str | None:
        """Why the upload was abandoned, if it was."""
        return self._error

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the upload settled; True if it succeeded."""
        self._settled.wait(timeout_s)
        return self.done

    def _resolve(self, record: protocol.CheckpointRecord | None) -> None:
        self._record = record
        self._settled.set()

    def _fail(self, error: str) -> None:
        self._error = error
        self._settled.set()


class BaseCheckpointStore(ABC):
    """Where checkpoints are written to and read from."""

    # why the control plane refused an upload for the trial's storage quota, or None
    quota_refusal: str | None = None

    @abstractmethod
    def save(
        self, state: Mapping[str, Any], step: int, metrics: Mapping[str, float]
    ) -> CheckpointHandle:
        """Persist ``state`` (rank 0 only)."""

    @abstractmethod
    def load(self, map_location: torch.device, *, weights_only: bool) -> dict[str, Any] | None:
        """The checkpoint to resume from, or None."""

    def begin_close(self, timeout_s: float) -> None:  # noqa: B027 (optional hook)
        """Finish pending writes, retrying for at most ``timeout_s``; accept no more."""

    def finish_close(self) -> bool:
        """Wait for :meth:`begin_close` to end; True if nothing is left behind."""
        return True

    def close(self, timeout_s: float) -> bool:
        self.begin_close(timeout_s)
        return self.finish_close()


def _write_atomically(state: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(dict(state), partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _load(path: Path, map_location: torch.device, weights_only: bool) -> dict[str, Any]:
    state = torch.load(path, map_location=map_location, weights_only=weights_only)
    if not isinstance(state, dict):
        raise TypeError(f"checkpoint {path} holds a {type(state).__name__}, expected a dict")
    return state


class LocalCheckpointStore(BaseCheckpointStore):
    """Standalone mode: ``<directory>/step-N.pt``; restore picks the highest N."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def save(
        self, state: Mapping[str, Any], step: int, metrics: Mapping[str, float]
    ) -> CheckpointHandle:
        path = self._directory / f"step-{step}.pt"
        _write_atomically(state, path)
        handle = CheckpointHandle(uuid_lib.uuid4().hex, step, path)
        handle._resolve(None)
        return handle

    def latest(self) -> Path | None:
        if not self._directory.is_dir():
            return None
        found = [
            (int(match.group(1)), entry)
            for entry in self._directory.iterdir()
            if (match := _STEP_FILE.match(entry.name))
        ]
        return max(found)[1] if found else None

    def load(self, map_location: torch.device, *, weights_only: bool) -> dict[str, Any] | None:
        path = self.latest()
        return None if path is None else _load(path, map_location, weights_only)


class RemoteCheckpointStore(BaseCheckpointStore):
    """Managed mode: spool, upload in the background, download on restore.

    Args:
        client_factory: Makes an HTTP client (the upload thread owns one).
        spool_dir: Node-local directory for checkpoint files on their way in or out.
        attempt: Sent with every upload.
        restore_checkpoint_id: What ``load`` downloads; None means a fresh start.
        backoff_factory: Retry spacing for one thread.
        restore_timeout_s: How long ``load`` retries while the control plane is away.
        before_upload: Called before each upload: delivers the metrics reported so far, so
            that a registered checkpoint never has steps before it whose metrics die with the
            node (a resumed trial does not report them again).
    """

    def __init__(
        self,
        client_factory: Callable[[], ControlPlaneClient],
        *,
        spool_dir: Path,
        attempt: int,
        restore_checkpoint_id: int | None,
        backoff_factory: Callable[[], Backoff],
        restore_timeout_s: float,
        before_upload: Callable[[], object] = lambda: None,
    ) -> None:
        self._client_factory = client_factory
        self._before_upload = before_upload
        self._spool_dir = spool_dir
        self._attempt = attempt
        self._restore_id = restore_checkpoint_id
        self._backoff_factory = backoff_factory
        self._restore_timeout_s = restore_timeout_s
        self._cond = threading.Condition()
        self._pending: deque[tuple[CheckpointHandle, dict[str, float]]] = deque()
        self._deadline = math.inf
        self._closing = False
        self._num_lost = 0
        self._waker = Waker()
        self._thread: threading.Thread | None = None

    def save(
        self, state: Mapping[str, Any], step: int, metrics: Mapping[str, float]
    ) -> CheckpointHandle:
        checkpoint_uuid = uuid_lib.uuid4().hex
        path = self._spool_dir / "checkpoints" / f"{checkpoint_uuid}.pt"
        _write_atomically(state, path)
        handle = CheckpointHandle(checkpoint_uuid, step, path)
        self._enqueue(handle, metrics)
        return handle

    def _enqueue(self, handle: CheckpointHandle, metrics: Mapping[str, float]) -> None:
        with self._cond:
            if self._closing:
                raise RuntimeError("save_checkpoint() after close(): the checkpoint was not saved")
            self._pending.append((handle, dict(metrics)))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="trainhub-checkpoints", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def save_shards(
        self,
        state: Mapping[str, Any],
        step: int,
        metrics: Mapping[str, float],
        *,
        rank: int,
        world_size: int,
    ) -> CheckpointHandle:
        """Every rank (a collective): write this rank's shards into the spool, then upload
        them in the background, each rank its own; the control plane publishes the set once
        every rank reported its files (ADR 0040)."""
        import torch.distributed as dist

        from trainhub.runtime.distributed.sharded_checkpoint import write_shards

        chosen = [uuid_lib.uuid4().hex if rank == 0 else None]
        dist.broadcast_object_list(chosen, src=0)
        checkpoint_uuid = str(chosen[0])
        folder = self._spool_dir / "checkpoints" / f"{checkpoint_uuid}.shards" / f"rank-{rank}"
        files = write_shards(state, folder)
        handle = CheckpointHandle(checkpoint_uuid, step, folder)
        handle.shard = (rank, world_size)
        handle.files = files
        self._enqueue(handle, metrics)
        return handle

    def load_shards(
        self,
        map_location: torch.device,
        *,
        weights_only: bool,
        rank: int,
        world_size: int,
        model: Any,
        optimizers: Any,
    ) -> dict[str, Any] | None:
        """The checkpoint to resume from when it is sharded: the manifest, the shared files
        (once per node) and the files of this rank's rows only; None where it is one file
        (:meth:`load` reads it)."""
        from trainhub.runtime.distributed.sharded_checkpoint import (
            METADATA,
            SHARED,
            needed_files,
            read_shards,
        )

        if self._restore_id is None:
            return None
        checkpoint_id = self._restore_id
        client = self._client_factory()
        try:
            manifest = self._retrying(
                lambda budget_s: client.get_manifest(checkpoint_id, budget_s),
                f"read the manifest of checkpoint {checkpoint_id}",
            )
            if not manifest.get("sharded"):
                return None
            members = {m["name"]: m for m in manifest["members"]}
            folder = self._spool_dir / "restore" / f"checkpoint-{checkpoint_id}.shards"
            folder.mkdir(parents=True, exist_ok=True)

            def fetch(name: str) -> None:
                member = members.get(name)
                if member is None:
                    return
                path = folder / name
                with _node_lock(folder / "locks" / f"{name}.lock"):
                    if path.exists():
                        return
                    self._retrying(
                        lambda budget_s: client.download_set_member(
                            checkpoint_id, name, path, budget_s
                        ),
                        f"download {name} of checkpoint {checkpoint_id}",
                    )
                    if _sha256(path) != member["sha256"]:
                        path.unlink()
                        raise RuntimeError(
                            f"cannot restore checkpoint {checkpoint_id}: its file {name} "
                            "fails its checksum (damaged in storage)"
                        )

            fetch(METADATA)
            fetch(SHARED)
            for name in sorted(needed_files(folder, rank, world_size)):
                fetch(name)
        finally:
            client.close()
        return read_shards(
            folder,
            model=model,
            optimizers=optimizers,
            device=map_location,
            weights_only=weights_only,
        )

    def _retrying(self, call: Callable[[float], Any], what: str) -> Any:
        deadline = time.monotonic() + self._restore_timeout_s
        try:
            return retry_transient(
                call, what=what, deadline=lambda: deadline, backoff=self._backoff_factory()
            )
        except ControlPlaneError as exc:
            raise RuntimeError(f"cannot {what}: the control plane refused: {exc}") from None
        except DeadlineExceeded as exc:
            raise RuntimeError(
                f"cannot {what}: the control plane stayed unreachable for "
                f"{self._restore_timeout_s:.0f} s ({exc.__cause__})"
            ) from None

    def load(self, map_location: torch.device, *, weights_only: bool) -> dict[str, Any] | None:
        if self._restore_id is None:
            return None
        path = self._spool_dir / "restore" / f"checkpoint-{self._restore_id}.pt"
        with _node_lock(path.with_suffix(".lock")):
            if not path.exists():
                self._download(self._restore_id, path)
        return _load(path, map_location, weights_only)

    def _download(self, checkpoint_id: int, path: Path) -> None:
        client = self._client_factory()
        deadline = time.monotonic() + self._restore_timeout_s
        try:
            retry_transient(
                lambda budget_s: client.download_checkpoint(checkpoint_id, path, budget_s),
                what=f"download checkpoint {checkpoint_id}",
                deadline=lambda: deadline,
                backoff=self._backoff_factory(),
            )
        except ControlPlaneError as exc:
            raise RuntimeError(
                f"cannot restore checkpoint {checkpoint_id} ({protocol.ENV_RESTORE_CHECKPOINT}): "
                f"the control plane refused the download: {exc}"
            ) from None
        except DeadlineExceeded as exc:
            raise RuntimeError(
                f"cannot restore checkpoint {checkpoint_id}: the control plane stayed unreachable "
                f"for {self._restore_timeout_s:.0f} s ({exc.__cause__})"
            ) from None
        finally:
            client.close()

    def begin_close(self, timeout_s: float) -> None:
        with self._cond:
            if not self._closing:
                self._closing = True
                self._deadline = time.monotonic() + timeout_s
            self._cond.notify_all()
        self._waker.wake()

    def finish_close(self) -> bool:
        with self._cond:
            thread = self._thread
        if thread is not None:
            # a try in flight may outlast the deadline by one request timeout
            thread.join(timeout=max(0.0, self._deadline - time.monotonic()) + 35.0)
        with self._cond:
            return not self._pending and self._num_lost == 0

    def _run(self) -> None:
        client = self._client_factory()
        backoff = self._backoff_factory()
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._pending or self._closing)
                    if not self._pending:
                        return
                    handle, metrics = self._pending[0]
                self._before_upload()
                try:
                    record = retry_transient(
                        functools.partial(self._upload, client, handle, metrics),
                        what=f"upload checkpoint of step {handle.step}",
                        deadline=lambda: self._deadline,
                        backoff=backoff,
                        waker=self._waker,
                    )
                except ControlPlaneError as exc:
                    message = f"the control plane refused the checkpoint: {exc}"
                    if exc.over_quota:
                        self.quota_refusal = str(exc)
                    print(
                        f"trainhub: checkpoint of step {handle.step} not registered, kept at "
                        f"{handle.path}: {message}",
                        file=sys.stderr,
                        flush=True,
                    )
                    handle._fail(message)
                    with self._cond:
                        self._num_lost += 1
                except DeadlineExceeded:
                    self._abandon_pending()
                    return
                else:
                    if handle.shard is None:
                        handle.path.unlink(missing_ok=True)
                    else:
                        shutil.rmtree(handle.path, ignore_errors=True)
                    handle._resolve(record)
                with self._cond:
                    self._pending.popleft()
                    self._cond.notify_all()
        finally:
            client.close()

    def _upload(
        self,
        client: ControlPlaneClient,
        handle: CheckpointHandle,
        metrics: Mapping[str, float],
        budget_s: float,
    ) -> protocol.CheckpointRecord | None:
        if handle.shard is not None:
            return self._upload_shards(client, handle, metrics, budget_s)
        return client.upload_checkpoint(
            handle.path,
            uuid=handle.uuid,
            step=handle.step,
            attempt=self._attempt,
            metrics=metrics,
            budget_s=budget_s,
        )

    def _upload_shards(
        self,
        client: ControlPlaneClient,
        handle: CheckpointHandle,
        metrics: Mapping[str, float],
        budget_s: float,
    ) -> protocol.CheckpointRecord | None:
        """This rank's files, each an object of its own, then its report; the record once the
        report published the set (the last rank's), else None (published by a later one)."""
        assert handle.shard is not None
        rank, world_size = handle.shard
        for name in handle.files:
            if name in handle._stored:
                continue  # stored by an earlier try of this upload
            path = handle.path / name
            answer = client.upload_set_member(
                path,
                uuid=handle.uuid,
                name=name,
                step=handle.step,
                attempt=self._attempt,
                budget_s=budget_s,
            )
            if answer.get("checkpoint"):  # published already: a retry after the outcome
                return cast(protocol.CheckpointRecord, answer["checkpoint"])
            handle._stored[name] = (path.stat().st_size, _sha256(path))
        report = {
            "world_size": world_size,
            "step": handle.step,
            "attempt": self._attempt,
            "metrics": dict(metrics),
            "members": [
                {"name": name, "size": size, "sha256": digest}
                for name, (size, digest) in sorted(handle._stored.items())
            ],
        }
        answer = client.report_set_rank(handle.uuid, rank, report, budget_s)
        found = answer.get("checkpoint")
        return cast(protocol.CheckpointRecord, found) if found else None

    def _abandon_pending(self) -> None:
        with self._cond:
            abandoned = list(self._pending)
            self._pending.clear()
            self._num_lost += len(abandoned)
        for handle, _ in abandoned:
            handle._fail("the control plane stayed unreachable until the flush timeout")
            print(
                f"trainhub: checkpoint of step {handle.step} was not uploaded (control plane "
                f"unreachable); it is kept at {handle.path}",
                file=sys.stderr,
                flush=True,
            )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _node_lock(path: Path) -> Iterator[None]:
    """An exclusive lock among the processes of one node (the ranks sharing a spool dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
