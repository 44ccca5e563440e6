"""HTTP calls to the control plane, and the retry rule every caller shares.

The rule: a connection error, a timeout, 408, 429 or any 5xx means the control plane is away
(restarting, overloaded) and the call is tried again with exponential back-off; any other 4xx
means the request itself is wrong (a bug, an expired token) and retrying cannot help.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx

from trainhub.runtime import protocol

logger = logging.getLogger("trainhub.runtime")

T = TypeVar("T")

_RETRYABLE_STATUS = frozenset({408, 429})
_CHUNK_BYTES = 1 << 20


class TransientError(Exception):
    """The control plane could not be reached or answered 408, 429 or 5xx: try again later.

    ``retry_after_s``: how long the control plane asked to wait (a 429's Retry-After: the
    trial's metric points over their per-minute cap), or None.
    """

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ControlPlaneError(Exception):
    """The control plane refused a request (4xx other than 408/429): retrying cannot help."""

    def __init__(self, message: str, status_code: int | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code  # the "code" of the JSON body (storage_quota_exceeded, ...)

    @property
    def over_quota(self) -> bool:
        """The trial passed a storage quota: the script hears it as QuotaExceeded."""
        return self.code == "storage_quota_exceeded"


class DeadlineExceeded(Exception):
    """Retries went on until the deadline; the last error is the ``__cause__``."""


class ControlPlaneClient:
    """The routes of :mod:`trainhub.runtime.protocol` for one trial.

    One instance per thread: each background thread of the runtime owns its client.
    """

    def __init__(self, api_url: str, token: str | None, trial_id: int, timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=api_url, headers=headers, timeout=timeout_s)
        self._trial_id = trial_id
        self._timeout_s = timeout_s
        # how checkpoint bytes travel: None (ask the control plane), "direct" (presigned
        # URLs to the bucket) or "control-plane" (through its API); ADR 0033
        self._route: str | None = None

    def close(self) -> None:
        self._http.close()

    def _read_ranges(self, plan: dict[str, Any], destination: Path, issued_at: float) -> None:
        """Read the object of a ``direct`` plan from the bucket in parallel ranges."""
        from trainhub.runtime import direct_storage  # boto-free; imported where it is used

        direct_storage.download_ranges(
            str(plan["url"]),
            int(plan["size_bytes"]),
            destination,
            issued_at=issued_at,
            expires_s=float(plan.get("expires_in_s") or 0),
            timeout_s=max(self._timeout_s, 60.0),
        )

    def _timeout(self, budget_s: float | None) -> float:
        if budget_s is None or not math.isfinite(budget_s):
            return self._timeout_s
        return max(0.5, min(self._timeout_s, budget_s))

    def post_metrics(
        self, batch: protocol.MetricsBatch, budget_s: float | None = None
    ) -> protocol.Signals | None:
        """Send a batch; the reply's signals (None from a server that answers 204)."""
        # json.dumps ourselves: the values were checked finite; keep the body compact
        body = json.dumps(batch, separators=(",", ":")).encode()
        response = _send(
            lambda: self._http.post(
                protocol.metrics_path(self._trial_id),
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=self._timeout(budget_s),
            )
        )
        _check(response, "POST metrics")
        if response.status_code == 204 or not response.content:
            return None
        return _signals(_json(response, "POST metrics"), "POST metrics")

    def post_startup(self, report: protocol.StartupReport) -> None:
        body = json.dumps(report, separators=(",", ":")).encode()
        response = _send(
            lambda: self._http.post(
                protocol.startup_path(self._trial_id),
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=self._timeout(None),
            )
        )
        _check(response, "POST startup")

    def post_sample_records(
        self, batch: protocol.SampleRecordsBatch, budget_s: float | None = None
    ) -> None:
        body = json.dumps(batch, separators=(",", ":")).encode()
        response = _send(
            lambda: self._http.post(
                protocol.samples_path(self._trial_id),
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=self._timeout(budget_s),
            )
        )
        _check(response, "POST samples")

    def upload_checkpoint(
        self,
        path: Path,
        *,
        uuid: str,
        step: int,
        attempt: int,
        metrics: Mapping[str, float],
        budget_s: float | None = None,
    ) -> protocol.CheckpointRecord:
        size = path.stat().st_size
        if self._route != "control-plane":
            direct = self._upload_direct(
                path, uuid=uuid, step=step, attempt=attempt, metrics=metrics, budget_s=budget_s
            )
            if direct is not None:
                return direct
            self._route = "control-plane"
        params = {
            "uuid": uuid,
            "step": str(step),
            "attempt": str(attempt),
            "metrics": json.dumps(dict(metrics), separators=(",", ":")),
        }
        response = _send(
            lambda: self._http.post(
                protocol.checkpoints_path(self._trial_id),
                params=params,
                content=_file_chunks(path),
                # an explicit length keeps httpx from chunking: simpler for every server
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                timeout=self._timeout(budget_s),
            )
        )
        _check(response, "upload checkpoint")
        record = _json(response, "upload checkpoint")
        if not isinstance(record, dict) or "id" not in record:
            raise ControlPlaneError(f"upload checkpoint: unexpected answer {record!r}")
        return cast(protocol.CheckpointRecord, record)

    def _upload_direct(
        self,
        path: Path,
        *,
        uuid: str,
        step: int,
        attempt: int,
        metrics: Mapping[str, float],
        budget_s: float | None,
    ) -> protocol.CheckpointRecord | None:
        """The checkpoint's parts straight to the bucket with URLs the control plane signs,
        then published by it; None where it answers that it stores through itself."""
        from trainhub.runtime import direct_storage

        body = {
            "uuid": uuid,
            "step": step,
            "attempt": attempt,
            "metrics": dict(metrics),
            "size_bytes": path.stat().st_size,
        }
        what = "begin direct checkpoint upload"
        issued_at = time.monotonic()
        response = _send(
            lambda: self._http.post(
                protocol.direct_checkpoint_path(self._trial_id),
                json=body,
                timeout=self._timeout(budget_s),
            )
        )
        if response.status_code == 404 and self._route is None:
            return None  # an older server without the route
        _check(response, what)
        plan = _json(response, what)
        route = plan.get("route") if isinstance(plan, dict) else None
        if route == "control-plane":
            return None
        self._route = "direct"
        if route == "stored":
            return cast(protocol.CheckpointRecord, plan["checkpoint"])
        if route != "direct":
            raise ControlPlaneError(f"{what}: unexpected answer {plan!r}")
        try:
            direct_storage.upload_parts(
                path, plan, issued_at=issued_at, timeout_s=max(self._timeout_s, 60.0)
            )
        except direct_storage.BucketUnreachable as exc:
            logger.warning(
                "the bucket is unreachable from here (%s): checkpoints go through "
                "the control plane",
                exc,
            )
            return None
        response = _send(
            lambda: self._http.post(
                protocol.direct_checkpoint_complete_path(self._trial_id),
                json={**body, "upload_id": plan["upload_id"]},
                timeout=max(self._timeout(budget_s), 60.0),
            )
        )
        _check(response, "complete direct checkpoint upload")
        record = _json(response, "complete direct checkpoint upload")
        if not isinstance(record, dict) or "id" not in record:
            raise ControlPlaneError(f"complete direct checkpoint upload: unexpected {record!r}")
        return cast(protocol.CheckpointRecord, record)

    def _download_direct(
        self, checkpoint_id: int, destination: Path, budget_s: float | None
    ) -> bool:
        """Fetch the checkpoint straight from the bucket; False where the control plane
        answers that it serves the bytes itself."""
        from trainhub.runtime import direct_storage

        what = f"direct download of checkpoint {checkpoint_id}"
        issued_at = time.monotonic()
        response = _send(
            lambda: self._http.get(
                protocol.direct_checkpoint_file_path(self._trial_id, checkpoint_id),
                timeout=self._timeout(budget_s),
            )
        )
        if response.status_code == 404 and self._route is None:
            self._route = "control-plane"  # an older server without the route (or no such
            return False  # checkpoint: the control plane's route says so by name)
        _check(response, what)
        plan = _json(response, what)
        if not isinstance(plan, dict) or plan.get("route") != "direct":
            self._route = "control-plane"
            return False
        try:
            self._read_ranges(plan, destination, issued_at)
        except direct_storage.BucketUnreachable as exc:
            logger.warning(
                "the bucket is unreachable from here (%s): restores go through the control plane",
                exc,
            )
            self._route = "control-plane"
            return False
        self._route = "direct"
        return True

    def download_checkpoint(
        self, checkpoint_id: int, destination: Path, budget_s: float | None = None
    ) -> None:
        """Stream the checkpoint's bytes into ``destination`` (written whole or not at all)."""
        partial = destination.with_name(f"{destination.name}.part-{threading.get_ident()}")
        if self._route != "control-plane":
            try:
                if self._download_direct(checkpoint_id, partial, budget_s):
                    partial.replace(destination)
                    return
            finally:
                partial.unlink(missing_ok=True)
        url = protocol.checkpoint_file_path(self._trial_id, checkpoint_id)
        try:
            with self._http.stream("GET", url, timeout=self._timeout(budget_s)) as response:
                if response.status_code >= 400:
                    response.read()
                    _check(response, f"download checkpoint {checkpoint_id}")
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes(_CHUNK_BYTES):
                        out.write(chunk)
            partial.replace(destination)
        except httpx.TransportError as exc:
            raise TransientError(f"download checkpoint {checkpoint_id}: {exc!r}") from exc
        finally:
            partial.unlink(missing_ok=True)

    # --- sharded checkpoints: one object per rank's file (ADR 0040) ---

    def upload_set_member(
        self,
        path: Path,
        *,
        uuid: str,
        name: str,
        step: int,
        attempt: int,
        budget_s: float | None = None,
    ) -> dict[str, Any]:
        """Store one file of a sharded checkpoint (straight to the bucket where the control
        plane signs URLs, else through its API); answers ``{name, size_bytes, ...}``, with
        ``checkpoint`` when the set is published already."""
        from trainhub.runtime import direct_storage

        member_path = protocol.set_member_path(self._trial_id, uuid, name)
        size = path.stat().st_size
        body = {"step": step, "attempt": attempt, "size_bytes": size}
        if self._route != "control-plane":
            issued_at = time.monotonic()
            what = f"begin direct upload of {name}"
            response = _send(
                lambda: self._http.post(
                    f"{member_path}/direct", json=body, timeout=self._timeout(budget_s)
                )
            )
            _check(response, what)
            plan = _json(response, what)
            route = plan.get("route") if isinstance(plan, dict) else None
            if route == "stored":
                return {"name": name, "size_bytes": 0, "checkpoint": plan["checkpoint"]}
            if route == "direct":
                try:
                    direct_storage.upload_parts(
                        path, plan, issued_at=issued_at, timeout_s=max(self._timeout_s, 60.0)
                    )
                except direct_storage.BucketUnreachable as exc:
                    logger.warning("the bucket is unreachable from here (%s)", exc)
                    self._route = "control-plane"
                else:
                    self._route = "direct"
                    what = f"complete direct upload of {name}"
                    response = _send(
                        lambda: self._http.post(
                            f"{member_path}/direct/complete",
                            json={**body, "upload_id": plan["upload_id"]},
                            timeout=max(self._timeout(budget_s), 60.0),
                        )
                    )
                    _check(response, what)
                    return cast(dict[str, Any], _json(response, what))
            else:
                self._route = "control-plane"
        response = _send(
            lambda: self._http.put(
                member_path,
                params={"step": str(step), "attempt": str(attempt)},
                content=_file_chunks(path),
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                timeout=self._timeout(budget_s),
            )
        )
        _check(response, f"upload {name}")
        return cast(dict[str, Any], _json(response, f"upload {name}"))

    def report_set_rank(
        self, uuid: str, rank: int, report: Mapping[str, Any], budget_s: float | None = None
    ) -> dict[str, Any]:
        """Say what this rank stored; ``published`` once every rank did."""
        what = f"report rank {rank} of checkpoint {uuid}"
        response = _send(
            lambda: self._http.post(
                protocol.set_rank_path(self._trial_id, uuid, rank),
                json=dict(report),
                timeout=max(self._timeout(budget_s), 60.0),
            )
        )
        _check(response, what)
        return cast(dict[str, Any], _json(response, what))

    def get_manifest(self, checkpoint_id: int, budget_s: float | None = None) -> dict[str, Any]:
        what = f"GET the manifest of checkpoint {checkpoint_id}"
        response = _send(
            lambda: self._http.get(
                protocol.checkpoint_manifest_path(self._trial_id, checkpoint_id),
                timeout=self._timeout(budget_s),
            )
        )
        _check(response, what)
        return cast(dict[str, Any], _json(response, what))

    def download_set_member(
        self, checkpoint_id: int, name: str, destination: Path, budget_s: float | None = None
    ) -> None:
        """One file of a sharded checkpoint into ``destination`` (straight from the bucket
        where the control plane signs a URL); written whole or not at all."""
        from trainhub.runtime import direct_storage

        path = protocol.checkpoint_member_path(self._trial_id, checkpoint_id, name)
        partial = destination.with_name(f"{destination.name}.part-{threading.get_ident()}")
        try:
            if self._route != "control-plane":
                issued_at = time.monotonic()
                what = f"direct download of {name}"
                response = _send(
                    lambda: self._http.get(f"{path}/direct", timeout=self._timeout(budget_s))
                )
                _check(response, what)
                plan = _json(response, what)
                if isinstance(plan, dict) and plan.get("route") == "direct":
                    try:
                        self._read_ranges(plan, partial, issued_at)
                    except direct_storage.BucketUnreachable as exc:
                        logger.warning("the bucket is unreachable from here (%s)", exc)
                        self._route = "control-plane"
                    else:
                        self._route = "direct"
                        partial.replace(destination)
                        return
                else:
                    self._route = "control-plane"
            try:
                with self._http.stream("GET", path, timeout=self._timeout(budget_s)) as response:
                    if response.status_code >= 400:
                        response.read()
                        _check(response, f"download {name}")
                    with partial.open("wb") as out:
                        for chunk in response.iter_bytes(_CHUNK_BYTES):
                            out.write(chunk)
            except httpx.TransportError as exc:
                raise TransientError(f"download {name}: {exc!r}") from exc
            partial.replace(destination)
        finally:
            partial.unlink(missing_ok=True)

    def get_signals(self, budget_s: float | None = None) -> protocol.Signals:
        response = _send(
            lambda: self._http.get(
                protocol.signals_path(self._trial_id), timeout=self._timeout(budget_s)
            )
        )
        _check(response, "GET signals")
        return _signals(_json(response, "GET signals"), "GET signals")

    def get_pending_profile(self, budget_s: float | None = None) -> dict[str, Any] | None:
        """The open profile request of this trial (id, steps, attempt), or None."""
        response = _send(
            lambda: self._http.get(
                protocol.profile_pending_path(self._trial_id), timeout=self._timeout(budget_s)
            )
        )
        _check(response, "GET pending profile")
        data = _json(response, "GET pending profile")
        found = data.get("profile") if isinstance(data, dict) else None
        return found if isinstance(found, dict) else None

    def upload_profile(
        self, profile_id: int, rank: int, top_ops: list[dict[str, Any]], trace_gz: bytes
    ) -> None:
        """One rank's top operators, then its gzip-compressed Chrome trace."""
        path = protocol.profile_rank_path(self._trial_id, profile_id, rank)
        response = _send(lambda: self._http.post(path, json={"top_ops": top_ops}))
        _check(response, "POST profile table")
        response = _send(
            lambda: self._http.put(
                f"{path}/trace",
                content=trace_gz,
                headers={"Content-Type": "application/octet-stream"},
                timeout=max(self._timeout_s, 60.0),
            )
        )
        _check(response, "PUT profile trace")


def _signals(data: Any, what: str) -> protocol.Signals:
    if not isinstance(data, dict) or not isinstance(data.get("should_stop"), bool):
        raise ControlPlaneError(f"{what}: unexpected answer {data!r}")
    reason = data.get("reason")
    return {"should_stop": data["should_stop"], "reason": None if reason is None else str(reason)}


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            yield chunk


def _send(request: Callable[[], httpx.Response]) -> httpx.Response:
    try:
        return request()
    except httpx.TransportError as exc:
        raise TransientError(repr(exc)) from exc


def _check(response: httpx.Response, what: str) -> None:
    status = response.status_code
    if status < 300:
        return
    detail = response.text[:500]
    if status in _RETRYABLE_STATUS or status >= 500:
        raise TransientError(f"{what}: HTTP {status} {detail}", _retry_after_s(response))
    try:
        code = str(response.json().get("code", ""))
    except (ValueError, AttributeError):
        code = ""
    raise ControlPlaneError(f"{what}: HTTP {status} {detail}", status, code)


def _retry_after_s(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (the form trainhub sends), capped at 10 minutes."""
    raw = response.headers.get("Retry-After", "")
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return min(600.0, seconds) if math.isfinite(seconds) and seconds >= 0 else None


def _json(response: httpx.Response, what: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise ControlPlaneError(f"{what}: answer is not JSON: {response.text[:200]!r}") from None


class Backoff:
    """Exponential back-off with jitter: initial, 2x initial, ... up to a ceiling."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self._initial_s = initial_s
        self._max_s = max_s
        self._next_s = initial_s

    def reset(self) -> None:
        self._next_s = self._initial_s

    def next_delay(self) -> float:
        delay = self._next_s
        self._next_s = min(self._max_s, max(self._next_s * 2, 0.01))
        # jitter spreads the retries of many ranks/trials after a control-plane restart
        return delay * random.uniform(0.8, 1.0)


class Waker:
    """A sleep that another thread can cut short (``close()`` wakes a backing-off sender)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    def sleep(self, seconds: float) -> None:
        with self._cond:
            generation = self._generation
            self._cond.wait_for(lambda: self._generation != generation, timeout=seconds)

    def wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()


def retry_transient(
    call: Callable[[float], T],
    *,
    what: str,
    deadline: Callable[[], float],
    backoff: Backoff,
    waker: Waker | None = None,
) -> T:
    """Run ``call(budget_s)`` until it returns, retrying :class:`TransientError`.

    Args:
        call: Does one try; receives the seconds left before the deadline (may be infinite).
        what: Names the operation in log lines.
        deadline: Returns the ``time.monotonic()`` instant after which to give up (the first
            try happens even past it); read before every try, so a caller may move it
            (``close()`` turns "never" into "in 10 minutes").
        backoff: Spacing of the tries; reset on success.
        waker: Lets another thread cut a back-off sleep short.

    Raises:
        DeadlineExceeded: The deadline passed; ``__cause__`` is the last TransientError.
        ControlPlaneError: The control plane refused the request; not retried.
    """
    failures = 0
    last_error: TransientError | None = None
    last_logged = -math.inf
    while True:
        budget = deadline() - time.monotonic()
        if budget <= 0 and failures:
            raise DeadlineExceeded(f"{what}: gave up after {failures} failed tries") from last_error
        budget = max(budget, 0.5)  # a past deadline still allows one short try
        try:
            result = call(budget)
        except TransientError as exc:
            failures += 1
            last_error = exc
            now = time.monotonic()
            # one line at the first failure and then every minute: enough to see an outage
            if now - last_logged >= 60:
                if exc.retry_after_s is not None:
                    logger.warning(
                        "trainhub: %s throttled by the control plane (%s); sending again in %.0f s",
                        what,
                        exc,
                        exc.retry_after_s,
                    )
                else:
                    logger.warning(
                        "trainhub: %s failed (%s); control plane unreachable, retrying", what, exc
                    )
                last_logged = now
            # the server's Retry-After wins over a shorter back-off: sooner is refused again
            wait_s = max(backoff.next_delay(), exc.retry_after_s or 0.0)
            delay = min(wait_s, max(0.0, deadline() - now))
            if waker is not None:
                waker.sleep(delay)
            else:
                time.sleep(delay)
            continue
        if failures:
            logger.warning("trainhub: %s succeeded after %d failed tries", what, failures)
        backoff.reset()
        return result
