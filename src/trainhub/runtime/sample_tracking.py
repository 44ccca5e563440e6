"""Training dynamics of samples (``ctx.track_samples``): recorded on the device, shipped in batches.

Per call the tracker copies the batch's logits, labels and ids into preallocated device
buffers (three copies, no host synchronisation). When the buffers fill up (or the epoch given
changes, or at exit) it computes for all buffered samples at once the margin of the given label
(its logit minus the largest other logit), the probability and loss of the given label and the
argmax, copies them to the host once, turns them into columns (floats rounded to float16
precision) and hands them to a sink: the control plane (``POST /trials/{id}/samples`` from a
background thread, retried like metrics) or, standalone, a JSON-lines file.

Epochs: pass ``epoch=`` (needed with several ranks: a distributed sampler moves samples
between ranks); without it, a sample's epoch is how often this rank saw it before.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from trainhub.runtime import protocol
from trainhub.runtime.transport import (
    Backoff,
    ControlPlaneClient,
    ControlPlaneError,
    DeadlineExceeded,
    retry_transient,
)

logger = logging.getLogger("trainhub.runtime")

DEFAULT_CAPACITY = 16_384  # records held on the device between two copies to the host
SEND_RECORDS = 4096  # records per request (well under the body limit)
MAX_BUFFERED_LOGITS = 1 << 22  # logits held on the device: 16 MiB of float32
_MAX_SOURCE_CHARS = 128


class BaseSampleSink(Protocol):
    def send(self, batch: protocol.SampleRecordsBatch) -> None: ...

    def close(self, timeout_s: float) -> bool: ...


class LocalSampleSink:
    """Standalone: one JSON line per batch, appended to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def send(self, batch: protocol.SampleRecordsBatch) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            out.write(json.dumps(batch, separators=(",", ":")) + "\n")

    def close(self, timeout_s: float) -> bool:
        return True


class RemoteSampleSink:
    """Managed: batches go to the control plane from one background thread, retried while it
    is unreachable; ``close`` waits for them up to its timeout."""

    def __init__(self, client: Callable[[], ControlPlaneClient], backoff: Backoff) -> None:
        self._client = client
        self._backoff = backoff
        self._queue: queue.Queue[protocol.SampleRecordsBatch | None] = queue.Queue()
        self._deadline = math.inf
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="trainhub-samples", daemon=True)
        self._thread.start()

    def send(self, batch: protocol.SampleRecordsBatch) -> None:
        self._queue.put(batch)

    def _run(self) -> None:
        client = self._client()
        try:
            while (batch := self._queue.get()) is not None:
                try:
                    retry_transient(
                        lambda budget, b=batch: client.post_sample_records(b, budget),  # type: ignore[misc]
                        what="sending sample records",
                        deadline=lambda: self._deadline,
                        backoff=self._backoff,
                    )
                except (ControlPlaneError, DeadlineExceeded) as exc:
                    self._failed = True
                    logger.error("trainhub: sample records not delivered: %s", exc)
        finally:
            client.close()

    def close(self, timeout_s: float) -> bool:
        self._deadline = time.monotonic() + timeout_s
        self._queue.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive() and not self._failed


def _integers(name: str, values: object) -> torch.Tensor:
    """``values`` as an integer tensor (a list or array is converted); else a clear error."""
    tensor = values if isinstance(values, torch.Tensor) else torch.as_tensor(values)
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must be integers; got {tensor.dtype}")
    return tensor


class SampleTracker:
    """Accumulates per-sample training dynamics of one rank; see the module docstring."""

    def __init__(
        self, device: torch.device, sink: BaseSampleSink, *, attempt: int = 1,
        capacity: int = DEFAULT_CAPACITY, flush_timeout_s: float = 600.0,
    ) -> None:  # fmt: skip
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1; got {capacity}")
        self.device = device
        self.sink = sink
        self.attempt = attempt
        self.capacity = capacity
        self.flush_timeout_s = flush_timeout_s
        # raw logits, labels and ids of the steps since the last flush: three copies per step;
        # margins and probabilities are computed for all of them at once when flushed
        self._logits: torch.Tensor | None = None  # (capacity, classes), made at the first call
        self._labels = torch.empty(capacity, dtype=torch.int64, device=device)
        self._ids = torch.empty(capacity, dtype=torch.int64, device=device)
        self._used = 0
        self._epochs: list[tuple[int, int | None]] = []  # (records, epoch) segments
        self._seen = np.zeros(0, dtype=np.int64)  # per id: epochs counted so far
        self._num_classes = 0
        self._source: str | None = None
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)

    def track(
        self,
        ids: torch.Tensor,
        logits: torch.Tensor,
        labels: torch.Tensor,
        *,
        epoch: int | None = None,
        source: str | None = None,
    ) -> None:
        if not isinstance(logits, torch.Tensor):
            raise TypeError(
                f"logits must be a tensor (batch, classes); got {type(logits).__name__}"
            )
        ids, labels = _integers("ids", ids), _integers("labels", labels)
        if logits.dim() != 2:
            raise ValueError(f"logits must be (batch, classes); got shape {tuple(logits.shape)}")
        size, classes = logits.shape
        if ids.shape != (size,) or labels.shape != (size,):
            raise ValueError(
                f"ids and labels must be ({size},) like the logits' batch; got "
                f"{tuple(ids.shape)} and {tuple(labels.shape)}"
            )
        # on the host they are checked here; on a GPU (a check would synchronise each step)
        # the flush leaves out the records of labels that are no class
        if labels.device.type == "cpu" and size:
            low, high = int(labels.min()), int(labels.max())
            if low < 0 or high >= classes:
                raise ValueError(
                    f"labels must lie in 0 .. {classes - 1} (the logits' classes); got "
                    f"{low if low < 0 else high}: pass the labels the loss uses"
                )
        if ids.device.type == "cpu" and size and int(ids.min()) < 0:
            raise ValueError(f"sample ids must be >= 0; got {int(ids.min())}")
        if epoch is not None and (
            isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0
        ):
            raise ValueError(f"epoch must be an int >= 0; got {epoch!r}")
        if source is not None:
            self._source = str(source)[:_MAX_SOURCE_CHARS]
        with self._lock:
            if self._closed:
                return
            if self._logits is None or self._logits.shape[1] != classes:
                self._flush_locked()
                self._num_classes = classes
                self.capacity = max(1, min(self.capacity, MAX_BUFFERED_LOGITS // classes))
                self._logits = torch.empty(
                    (self.capacity, classes), dtype=torch.float32, device=self.device
                )
            if self._epochs and epoch is not None and self._epochs[-1][1] != epoch:
                self._flush_locked()  # a new epoch: ship the last one while it is fresh
            if self._used + size > self.capacity:
                self._flush_locked()
            if size > self.capacity:
                raise ValueError(
                    f"a batch of {size} exceeds the tracker's capacity {self.capacity}"
                )
            end = self._used + size
            with torch.no_grad():
                self._logits[self._used : end].copy_(logits.detach(), non_blocking=True)
                self._labels[self._used : end].copy_(labels.detach(), non_blocking=True)
                self._ids[self._used : end].copy_(ids.detach(), non_blocking=True)
            self._used = end
            if self._epochs and self._epochs[-1][1] == epoch:
                self._epochs[-1] = (self._epochs[-1][0] + size, epoch)
            else:
                self._epochs.append((size, epoch))

    def flush(self) -> None:
        """Copy what is recorded to the host and hand it to the sink (one synchronisation)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._used == 0:
            return
        assert self._logits is not None
        with torch.no_grad():
            z = self._logits[: self._used]
            labels = self._labels[: self._used].view(-1, 1)
            valid = ((labels >= 0) & (labels < z.shape[1])).view(-1)
            y = labels.clamp(0, z.shape[1] - 1)  # a gather out of bounds kills a CUDA process
            given = z.gather(1, y)
            others = z.scatter(1, y, float("-inf")).amax(1, keepdim=True)
            log_prob = given - torch.logsumexp(z, 1, keepdim=True)
            floats = torch.cat([given - others, log_prob], 1).cpu().numpy()
            ints = torch.stack([self._ids[: self._used], y.view(-1), z.argmax(1)], 1).cpu().numpy()
            kept = valid.cpu().numpy()
        epochs = self._epoch_column(ints[:, 0])
        if not kept.all():
            logger.warning(
                "trainhub: track_samples got %d labels outside 0 .. %d (e.g. %d); their records "
                "are left out: pass the labels the loss uses",
                int((~kept).sum()),
                z.shape[1] - 1,
                int(labels.view(-1)[torch.from_numpy(~kept).to(labels.device)][0]),
            )
            floats, ints, epochs = floats[kept], ints[kept], epochs[kept]
        self._used = 0
        self._epochs = []
        margins = _half(floats[:, 0])
        log_probs = floats[:, 1].astype(np.float64)
        probs = _half(np.exp(log_probs))
        losses = _half(-log_probs)
        for start in range(0, len(ints), SEND_RECORDS):
            part = slice(start, start + SEND_RECORDS)
            batch: protocol.SampleRecordsBatch = {
                "attempt": self.attempt,
                "uuid": uuidlib.uuid4().hex,
                "source": self._source,
                "num_classes": self._num_classes,
                "ids": ints[part, 0].tolist(),
                "epochs": epochs[part].tolist(),
                "labels": ints[part, 1].tolist(),
                "predictions": ints[part, 2].tolist(),
                "margins": margins[part].tolist(),
                "probs": probs[part].tolist(),
                "losses": losses[part].tolist(),
            }
            self.sink.send(batch)

    def _epoch_column(self, ids: np.ndarray) -> np.ndarray:
        epochs = np.empty(len(ids), dtype=np.int64)
        start = 0
        for count, epoch in self._epochs:
            part = ids[start : start + count]
            if epoch is not None:
                epochs[start : start + count] = epoch
            else:  # how often this id was seen before, then count this sighting
                if len(part) and part.max() >= len(self._seen):
                    grown = np.zeros(int(part.max()) + 1, dtype=np.int64)
                    grown[: len(self._seen)] = self._seen
                    self._seen = grown
                order = np.argsort(part, kind="stable")
                ordered = part[order]
                first = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1]
                within = np.arange(len(part)) - np.repeat(first, np.diff(np.r_[first, len(part)]))
                result = np.empty(len(part), dtype=np.int64)
                result[order] = self._seen[ordered] + within
                epochs[start : start + count] = result
                np.add.at(self._seen, part, 1)
            start += count
        return epochs

    def close(self, timeout_s: float | None = None) -> bool:
        """Ship what is left and wait for delivery; later calls do nothing."""
        with self._lock:
            if self._closed:
                return True
            self._flush_locked()
            self._closed = True
        atexit.unregister(self.close)
        return self.sink.close(self.flush_timeout_s if timeout_s is None else timeout_s)


def _half(values: np.ndarray) -> np.ndarray:
    """float16 precision (what is stored), clipped to its range, as float64 for JSON."""
    half: np.ndarray = np.clip(values, -65504.0, 65504.0).astype(np.float16)
    return half.astype(np.float64)


def make_tracker(
    *,
    device: torch.device,
    rank: int,
    attempt: int,
    api_url: str | None,
    token: str | None,
    trial_id: int | None,
    request_timeout_s: float,
    retry_initial_s: float,
    retry_max_s: float,
    flush_timeout_s: float,
    local_dir: Path,
) -> SampleTracker:
    """The tracker of a rank: remote when managed, else a file in ``local_dir``."""
    sink: BaseSampleSink
    if api_url is not None and trial_id is not None:

        def client() -> ControlPlaneClient:
            return ControlPlaneClient(api_url, token, trial_id, request_timeout_s)

        sink = RemoteSampleSink(client, Backoff(retry_initial_s, retry_max_s))
    else:
        name = "trainhub-samples.jsonl" if rank == 0 else f"trainhub-samples.rank{rank}.jsonl"
        sink = LocalSampleSink(local_dir / name)
    return SampleTracker(device, sink, attempt=attempt, flush_timeout_s=flush_timeout_s)
