"""Rank 0's view of the control plane's signals (stop: pruned, preempted, canceled).

Two ways in: the reply to every metrics report carries the signals (:meth:`SignalPoller.offer`,
so a prune decided on a report is known as soon as the report is acknowledged), and a
background thread asks ``GET /trials/{id}/signals`` every ``poll_s`` seconds as a heartbeat for
scripts that report rarely. ``should_stop()`` reads the cached answer. Once the control plane
said stop, the answer stays stop. While the control plane is unreachable the last answer holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from trainhub.runtime import protocol
from trainhub.runtime.transport import ControlPlaneClient, ControlPlaneError, TransientError

logger = logging.getLogger("trainhub.runtime")


@dataclass(frozen=True)
class StopSignal:
    should_stop: bool
    reason: str | None = None


class SignalPoller:
    """Polls signals in the background, started on the first :meth:`current` call.

    Args:
        client_factory: Makes the HTTP client the polling thread owns.
        poll_s: Seconds between two requests.
        first_answer_timeout_s: How long the first :meth:`current` waits for the first answer,
            so a stop that is already decided is seen at the first check.
    """

    def __init__(
        self,
        client_factory: Callable[[], ControlPlaneClient],
        *,
        poll_s: float,
        first_answer_timeout_s: float = 2.0,
    ) -> None:
        self._client_factory = client_factory
        self._poll_s = poll_s
        self._first_answer_timeout_s = first_answer_timeout_s
        self._lock = threading.Lock()
        self._signal = StopSignal(False)
        self._answered = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> StopSignal:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="trainhub-signals", daemon=True
                )
                self._thread.start()
                first = True
            else:
                first = False
        if first:
            self._answered.wait(self._first_answer_timeout_s)
        with self._lock:
            return self._signal

    def offer(self, answer: protocol.Signals) -> None:
        """Take the signals a reply carried (the metrics sender calls it); a stop sticks."""
        with self._lock:
            if answer["should_stop"] and not self._signal.should_stop:
                self._signal = StopSignal(True, answer["reason"])

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)

    def _run(self) -> None:
        client = self._client_factory()
        refused_logged = False
        try:
            while not self._stopped.is_set():
                try:
                    answer = client.get_signals(budget_s=max(self._poll_s, 1.0))
                except TransientError as exc:
                    logger.debug("trainhub: GET signals failed: %s", exc)
                except ControlPlaneError as exc:
                    if not refused_logged:
                        logger.error("trainhub: the control plane refused GET signals: %s", exc)
                        refused_logged = True
                else:
                    self.offer(answer)
                    if self._signal.should_stop:
                        self._answered.set()
                        return
                self._answered.set()
                self._stopped.wait(self._poll_s)
        finally:
            client.close()
