"""``trainhub profile``: where a running trial's steps spend their time, on every rank.

Each rank polls the control plane for a profile request in a background thread (every
``TRAINHUB_PROFILE_POLL_S`` seconds, default 5), so :meth:`RankProfiler.step` never waits on
the network while nothing is asked. When a request appears, the rank runs torch.profiler over
its next ``steps`` calls of ``step()`` (CPU, and CUDA where the rank has a GPU), then uploads
the top operators by self time and its Chrome trace (gzip; opens in https://ui.perfetto.dev).
Ranks profile independently: they need not start at the same step, and a rank that has no
steps left simply never answers (the control plane gives the profile up after a while).
"""

from __future__ import annotations

import gzip
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainhub.runtime import protocol
from trainhub.runtime.transport import ControlPlaneClient, ControlPlaneError, TransientError

logger = logging.getLogger("trainhub.runtime")

TOP_OPS = 20
_DEFAULT_POLL_S = 5.0


def _ms(us: float | None) -> float:
    return round(float(us or 0.0) / 1000.0, 4)


def top_operators(profiler: torch.profiler.profile, limit: int = TOP_OPS) -> list[dict[str, Any]]:
    """The operators with the most self time (device time first where a GPU was used)."""
    rows = []
    for event in profiler.key_averages():
        self_device = getattr(event, "self_device_time_total", None)
        if self_device is None:
            self_device = getattr(event, "self_cuda_time_total", 0.0)
        device_total = getattr(event, "device_time_total", None)
        if device_total is None:
            device_total = getattr(event, "cuda_time_total", 0.0)
        rows.append(
            {
                "name": str(event.key)[:512],
                "calls": int(event.count),
                "self_cpu_ms": _ms(event.self_cpu_time_total),
                "cpu_total_ms": _ms(event.cpu_time_total),
                "self_device_ms": _ms(self_device),
                "device_total_ms": _ms(device_total),
            }
        )
    rows.sort(key=lambda r: (r["self_device_ms"], r["self_cpu_ms"]), reverse=True)
    return rows[:limit]


class RankProfiler:
    """One rank's side of ``trainhub profile``; see the module docstring.

    Args:
        client_factory: Makes the HTTP client the polling thread (and the upload) uses.
        rank: This process's rank.
        poll_s: Seconds between two polls for a request.
        use_cuda: Also record CUDA kernels.
    """

    def __init__(
        self,
        client_factory: Callable[[], ControlPlaneClient],
        rank: int,
        *,
        poll_s: float = _DEFAULT_POLL_S,
        use_cuda: bool = False,
    ) -> None:
        self._client_factory = client_factory
        self._rank = rank
        self._poll_s = poll_s
        self._use_cuda = use_cuda
        self._lock = threading.Lock()
        self._pending: dict[str, Any] | None = None
        self._finished: set[int] = set()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._active: torch.profiler.profile | None = None
        self._active_id = 0
        self._steps_left = 0
        self.results: list[dict[str, Any]] = []  # what this rank uploaded (for tests, logs)

    def step(self) -> None:
        """Call once per training step, on every rank."""
        if self._active is not None:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._finish()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="trainhub-profile", daemon=True)
            self._thread.start()
        with self._lock:
            request = self._pending
        if request is not None and int(request["id"]) not in self._finished:
            self._start(int(request["id"]), int(request["steps"]))

    def close(self) -> None:
        self._stopped.set()
        if self._active is not None:
            self._active.stop()
            self._active = None

    def _start(self, profile_id: int, steps: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._use_cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        logger.info(
            "trainhub: rank %d profiles %d steps (profile %d)", self._rank, steps, profile_id
        )
        profiler = torch.profiler.profile(activities=activities)
        profiler.start()
        self._active, self._active_id, self._steps_left = profiler, profile_id, steps

    def _finish(self) -> None:
        profiler, profile_id = self._active, self._active_id
        assert profiler is not None
        self._active = None
        self._finished.add(profile_id)
        profiler.stop()
        ops = top_operators(profiler)
        with tempfile.TemporaryDirectory(prefix="trainhub-profile-") as scratch:
            path = Path(scratch) / "trace.json"
            profiler.export_chrome_trace(str(path))
            trace = gzip.compress(path.read_bytes(), compresslevel=6)
        client = self._client_factory()
        try:
            client.upload_profile(profile_id, self._rank, ops, trace)
        except (ControlPlaneError, TransientError) as exc:
            logger.error(
                "trainhub: rank %d could not upload profile %d: %s", self._rank, profile_id, exc
            )
        finally:
            client.close()
        self.results.append({"profile_id": profile_id, "top_ops": ops, "trace_bytes": len(trace)})

    def _poll(self) -> None:
        client = self._client_factory()
        try:
            while not self._stopped.is_set():
                try:
                    found = client.get_pending_profile(budget_s=max(self._poll_s, 1.0))
                except (ControlPlaneError, TransientError) as exc:
                    logger.debug("trainhub: GET pending profile failed: %s", exc)
                else:
                    with self._lock:
                        self._pending = found
                self._stopped.wait(self._poll_s)
        finally:
            client.close()


def profiler_for(
    api_url: str | None, token: str | None, trial_id: int | None, rank: int, device: torch.device
) -> RankProfiler | None:
    """The rank's profiler for a managed trial; None standalone (nothing to answer to)."""
    if api_url is None or trial_id is None:
        return None
    poll_s = float(os.environ.get(protocol.ENV_PROFILE_POLL_S) or _DEFAULT_POLL_S)

    def client() -> ControlPlaneClient:
        return ControlPlaneClient(api_url, token, trial_id, 30.0)

    return RankProfiler(client, rank, poll_s=max(0.05, poll_s), use_cuda=device.type == "cuda")
