"""The ports the services need, and the plain values that cross them.

Adapters implement these: ``trainhub.adapters.ray_executor`` the :class:`Executor`,
``trainhub.adapters.storage`` the :class:`ArtifactStore`, ``trainhub.adapters.db`` the
repository. Services depend on these protocols, never on the adapters.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from trainhub.core.attempts import AttemptPhase, RankPhase
from trainhub.core.checkpoint_leftovers import UnfinishedUpload
from trainhub.core.resources import Node
from trainhub.core.spec import Placement
from trainhub.core.traffic import NamespaceSample

__all__ = [
    "ArtifactStore",
    "AttemptLaunch",
    "AttemptPhase",
    "AttemptStatus",
    "BlobInfo",
    "DirectDownload",
    "DirectTransfers",
    "DirectUpload",
    "Executor",
    "Principal",
    "RankPhase",
    "RankStatus",
    "UnfinishedUpload",
]


@dataclass(frozen=True)
class AttemptLaunch:
    """Everything the executor needs to start all ranks of one attempt of a trial."""

    attempt_key: str  # unique name, e.g. "t12-a2"; also names Ray actors and the placement group
    trial_id: int
    attempt: int
    argv: tuple[str, ...]  # the entrypoint, split; run in the unpacked context directory
    context_archive: bytes  # tar.gz of the code context (already checked safe on upload)
    env: Mapping[str, str]  # TRAINHUB_* and user variables, the same for every rank
    placement: tuple[str, ...]  # node id of each rank, as the policy chose
    gpus_per_worker: int = 0
    cpus_per_worker: float = 1.0
    memory_gb_per_worker: float | None = None
    strategy: Placement = Placement.PACK
    # the trial's own environment (a venv layered over the base, read-only), if it asks for one
    environment_dir: str | None = None
    # its content address: with no ``environment_dir`` the node's own cache holds it (ADR 0034)
    environment_key: str | None = None
    pin_cpus: bool = False  # each rank gets whole cores of its own (cgroup cpuset)
    # an interactive session's persistent home ("tenant-<t>/user-<u>"): the executor keeps it
    # under its storage root across sessions and mounts it as the rank's HOME (docs/sessions.md)
    home_key: str | None = None


@dataclass(frozen=True)
class RankStatus:
    rank: int
    phase: RankPhase
    exit_code: int | None = None
    # new output of the rank (stdout and stderr interleaved) from the offset asked for
    log_chunk: bytes = b""
    node_id: str | None = None
    # the bytes of the rank's whole output on its node (None: not known), and what its node
    # measured of the trial's folders it sees: (path, bytes) pairs (issue 24)
    log_size: int | None = None
    disk: tuple[tuple[str, int], ...] = ()
    detail: str = ""  # why it ended, when the executor knows more than the exit code (OOM)
    # the byte counters of the trial's namespace on the rank's node, and the wire bytes its
    # communication hooks counted (core/traffic.py, docs/adr/0045); None: not measured
    network: NamespaceSample | None = None
    hooks_wire_bytes: int | None = None


@dataclass(frozen=True)
class AttemptStatus:
    attempt_key: str
    phase: AttemptPhase
    ranks: tuple[RankStatus, ...] = ()
    detail: str = ""


class TrialFiles(Protocol):
    """The folders a trial writes on its nodes besides the API (its checkpoint folder):
    made read-only when the trial passes its storage quota, removed when the trial ends."""

    def freeze_trial_files(self, trial_id: int) -> None: ...
    def discard_trial_files(self, trial_id: int) -> None: ...


class TrialEventFiles(Protocol):
    """TensorBoard event files a trial wrote in its own folder (``{relative path: bytes}``)."""

    def trial_event_files(self, trial_id: int, max_bytes: int) -> dict[str, bytes]: ...


class Executor(Protocol):
    """Runs attempts on the cluster. Implementations must be safe to call from one thread."""

    def cluster_nodes(self) -> list[Node]:
        """Every alive node with its total and free capacity now."""
        ...

    def launch(self, launch: AttemptLaunch) -> None:
        """Start placing and running all ranks; returns without waiting for them."""
        ...

    def poll(self, attempt_key: str, log_offsets: Mapping[int, int]) -> AttemptStatus:
        """State of every rank, with output produced past ``log_offsets[rank]`` bytes."""
        ...

    def terminate(self, attempt_key: str, grace_s: float = 10.0) -> None:
        """End the process tree of every rank: SIGTERM, then SIGKILL after ``grace_s``."""
        ...

    def release(self, attempt_key: str) -> None:
        """Free the attempt's actors and placement group. Idempotent."""
        ...

    def live_attempts(self) -> list[str]:
        """Attempt keys whose actors exist (used to reconcile after a control-plane restart)."""
        ...


@dataclass(frozen=True)
class SessionEndpoint:
    """How the control plane reaches a session's server: its unix socket, on this host
    (``relay`` None), or through the relay of its node (adapters/session_relay.py, ADR 0041),
    which asks for proof of ``relay_secret`` before it splices a connection to the socket."""

    socket: str  # the socket's path on the session's node
    relay: tuple[str, int] | None = None  # (node address, port) of the node's relay
    relay_secret: str = field(default="", repr=False)

    @property
    def key(self) -> str:
        """Names the endpoint (one keep-alive client per endpoint)."""
        if self.relay is None:
            return self.socket
        return f"{self.relay[0]}:{self.relay[1]}#{self.relay_secret[:12]}"


class SessionEndpoints(Protocol):
    """Where the server of a session's attempt listens, as the control plane reaches it."""

    def session_endpoint(self, attempt_key: str) -> SessionEndpoint | None:
        """How to reach the attempt's session server (None: it is not there yet)."""
        ...


class BlobWriter(Protocol):
    """A blob being written in chunks; invisible under its key until ``commit``."""

    size: int

    def write(self, data: bytes) -> None: ...

    def commit(self) -> int:
        """Make the blob visible under its key (atomically); returns its size in bytes."""
        ...

    def abort(self) -> None:
        """Drop what was written; idempotent, a no-op after ``commit``."""
        ...


@dataclass(frozen=True)
class BlobInfo:
    """One stored blob, as :meth:`ArtifactStore.list` reports it."""

    key: str
    size: int  # bytes, the same number quotas and retention count on every backend


class ArtifactStore(Protocol):
    """Blobs by key: code contexts, checkpoints, logs. Keys are '/'-separated relative paths.

    Blobs of any size move through ``open_writer``, ``put_file`` and ``iter_chunks`` in
    chunks; ``put`` and ``get`` are for small ones (logs, tests).

    The contract every backend keeps (tests/adapters/test_storage_contract.py runs it on each):
    a key that leaves the store (``..``, absolute, empty segments) is refused with
    InvalidRequest; a blob is whole or absent (a writer's bytes are invisible until
    ``commit``; a process killed mid-write leaves nothing under the key); ``size`` and
    ``list`` count exactly the bytes written; a set of blobs (a sharded checkpoint, a dataset
    version) becomes visible at once through a manifest written last
    (``trainhub.service.artifact_sets``). Implementations: ``trainhub.adapters.storage``
    (a local or shared folder, S3 and compatible stores).
    """

    url: str  # where it stores (a folder or s3://bucket/prefix), for messages

    def list(self, prefix: str) -> list[BlobInfo]:
        """Every committed blob whose key starts with ``prefix``, sorted by key."""
        ...

    def put(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, source: BinaryIO) -> int:
        """Copy an open binary file into ``key`` in chunks; returns its size."""
        ...

    def open_writer(self, key: str) -> BlobWriter: ...

    def iter_chunks(self, key: str, chunk_bytes: int = ...) -> Iterator[bytes]:
        """The blob's bytes in chunks; raises NotFound (before any chunk) when it is absent."""
        ...

    def get(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        """Size in bytes, 0 when the key does not exist."""
        ...

    def write_at(self, key: str, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` (truncating what follows): repeatable appends. An
        append at the end costs its own bytes on every backend (a bucket keeps segments)."""
        ...

    def read_range(self, key: str, offset: int, length: int | None = None) -> bytes: ...

    def delete(self, key: str) -> None: ...

    def list_unfinished(self, prefix: str) -> builtins.list[UnfinishedUpload]:
        """Writes begun under ``prefix`` and never committed nor aborted (a process killed
        mid-write; a rank's presigned parts never completed), sorted by key: on S3 the
        multipart uploads, on a folder the writers' temporary files. Never listed by
        ``list``; the checkpoint sweep aborts them (ADR 0047)."""
        ...

    def abort_unfinished(self, upload: UnfinishedUpload) -> None:
        """Drop an unfinished write and the bytes it holds; idempotent."""
        ...


@dataclass(frozen=True)
class DirectUpload:
    """A multipart upload a rank sends itself: one presigned PUT URL per part (``urls[i]``
    is part ``i + 1``, ``part_bytes`` each but the last), valid ``expires_s`` seconds.
    ``stored``: part number -> ETag of parts a killed earlier try already stored (the rank
    skips a part whose MD5 equals it)."""

    upload_id: str
    part_bytes: int
    urls: tuple[str, ...]
    stored: Mapping[int, str]
    expires_s: int


@dataclass(frozen=True)
class DirectDownload:
    """A presigned GET URL of one blob (ranged reads allowed), valid ``expires_s`` seconds."""

    url: str
    size: int
    expires_s: int


class DirectTransfers(Protocol):
    """What a store offers ranks that move bytes themselves (presigned URLs, ADR 0033): the
    S3 store has it, a folder does not. A URL reaches one key, for a short time."""

    def presign_upload(self, key: str, size: int, expires_s: int) -> DirectUpload:
        """Open (or find again, after a killed try) the upload of ``key``; sign its parts."""
        ...

    def presigned_writer(self, key: str, upload_id: str, size: int) -> BlobWriter:
        """The upload's parts as sent, checked against ``size``: ``commit`` publishes them."""
        ...

    def presign_download(self, key: str, expires_s: int) -> DirectDownload:
        """A GET URL of ``key`` (NotFound when it is absent)."""
        ...


@dataclass(frozen=True)
class Principal:
    """Who is calling: a user (with roles per tenant) or one trial (its runtime)."""

    user_id: int | None
    username: str
    is_admin: bool = False
    roles: Mapping[str, str] = field(default_factory=dict)  # tenant name -> admin|member|viewer
    trial_id: int | None = None  # set for trial-scoped tokens
