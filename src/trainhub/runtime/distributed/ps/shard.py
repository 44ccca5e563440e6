"""One parameter-server shard: a slice of the flat parameters and the consistency rules.

Pure asyncio and numpy (:mod:`.server` serves shards from an event loop of a rank's process,
so many workers' calls run concurrently). Workers call :meth:`push_pull` once per step with
their gradient for this slice; it applies the optimizer's update (``torch.optim.SGD`` with
momentum, dampening, Nesterov and weight decay, or ``torch.optim.Adam``/``AdamW``, to the same
arithmetic in float32) under one of three consistency models and returns the weights the worker
continues from:

- ``sync`` (bulk-synchronous): the shard waits for all ``num_workers`` gradients of step ``c``,
  applies their mean once, and answers everyone with the same new weights. Equal to SGD on the
  combined batch.
- ``async`` (Hogwild-style, Recht et al. 2011 / Dean et al. 2012): each gradient is applied as it
  arrives and the current weights are returned at once; staleness is unbounded.
- ``ssp`` (stale-synchronous parallel, Ho et al. 2013): like async, but a worker that finished
  step ``c`` waits until the slowest worker has finished step ``c - staleness``; with
  ``staleness=0`` every step waits for everyone.

Every answer is recorded (worker, its clock, the slowest clock, the weights' version, the version
its gradient was computed on) so tests can check the bounds.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

CONSISTENCY_MODELS = ("sync", "async", "ssp")


OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class Hyper:
    """The optimizer's hyperparameters, sent with every push (the worker's lr schedule applies).

    ``kind`` is ``sgd`` (``momentum``, ``dampening``, ``nesterov``, ``weight_decay`` as
    ``torch.optim.SGD``), ``adam`` (L2 ``weight_decay`` added to the gradient) or ``adamw``
    (decoupled weight decay), both with ``betas`` and ``eps`` as in torch.
    """

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    kind: str = "sgd"
    dampening: float = 0.0
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}; got {self.kind!r}")


@dataclass(frozen=True)
class Event:
    worker: int
    clock: int  # steps this worker has completed, this one included
    min_clock: int  # the slowest worker's clock when the answer left
    version: int  # updates applied to this shard when the answer left
    based_on: int  # version of the weights the gradient was computed on


class ParameterShard:
    """A slice of the model's flat float32 parameters.

    Args:
        weights: initial values of this slice.
        num_workers: workers that push (``sync`` waits for this many).
        consistency: ``sync``, ``async`` or ``ssp``.
        staleness: ``ssp``'s bound ``s``.
    """

    def __init__(
        self, weights: np.ndarray, num_workers: int, consistency: str, staleness: int = 0
    ) -> None:
        if consistency not in CONSISTENCY_MODELS:
            raise ValueError(
                f"consistency must be one of {CONSISTENCY_MODELS}; got {consistency!r}"
            )
        if num_workers < 1 or staleness < 0:
            raise ValueError("num_workers must be >= 1 and staleness >= 0")
        self.weights = np.array(weights, dtype=np.float32, copy=True)
        self.momentum_buffer: np.ndarray | None = None
        self.exp_avg: np.ndarray | None = None
        self.exp_avg_sq: np.ndarray | None = None
        self.adam_steps = 0
        self.num_workers = num_workers
        self.consistency = consistency
        self.staleness = staleness
        self.version = 0
        self.clocks = [0] * num_workers
        self._round_sum: np.ndarray | None = None
        self._round_count = 0
        self._changed: asyncio.Condition | None = None
        self.events: deque[Event] = deque(maxlen=100_000)

    @property
    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # created lazily inside the actor's event loop
            self._changed = asyncio.Condition()
        return self._changed

    def _apply(self, grad: np.ndarray, hyper: Hyper) -> None:
        if hyper.kind == "sgd":
            self._apply_sgd(grad, hyper)
        else:
            self._apply_adam(grad, hyper)
        self.version += 1

    def _apply_sgd(self, grad: np.ndarray, hyper: Hyper) -> None:
        """``torch.optim.SGD``: d = g + wd*w; buf = m*buf + (1-damp)*d (buf = d at first);
        d = d + m*buf with Nesterov, else buf; w -= lr*d."""
        d = grad + np.float32(hyper.weight_decay) * self.weights if hyper.weight_decay else grad
        if hyper.momentum:
            if self.momentum_buffer is None:
                self.momentum_buffer = np.array(d, dtype=np.float32, copy=True)
            else:
                self.momentum_buffer *= np.float32(hyper.momentum)
                self.momentum_buffer += np.float32(1.0 - hyper.dampening) * d
            if hyper.nesterov:
                d = d + np.float32(hyper.momentum) * self.momentum_buffer
            else:
                d = self.momentum_buffer
        self.weights -= np.float32(hyper.lr) * d

    def _apply_adam(self, grad: np.ndarray, hyper: Hyper) -> None:
        """``torch.optim.Adam`` (L2 decay into the gradient) or ``AdamW`` (decoupled decay)."""
        if self.exp_avg is None or self.exp_avg_sq is None:
            self.exp_avg = np.zeros_like(self.weights)
            self.exp_avg_sq = np.zeros_like(self.weights)
        if hyper.weight_decay and hyper.kind == "adamw":
            self.weights *= np.float32(1.0 - hyper.lr * hyper.weight_decay)
        elif hyper.weight_decay:
            grad = grad + np.float32(hyper.weight_decay) * self.weights
        self.adam_steps += 1
        b1, b2 = hyper.beta1, hyper.beta2
        self.exp_avg *= np.float32(b1)
        self.exp_avg += np.float32(1.0 - b1) * grad
        self.exp_avg_sq *= np.float32(b2)
        self.exp_avg_sq += np.float32(1.0 - b2) * grad * grad
        correction1 = 1.0 - b1**self.adam_steps
        correction2 = 1.0 - b2**self.adam_steps
        denom = np.sqrt(self.exp_avg_sq) / np.float32(np.sqrt(correction2)) + np.float32(hyper.eps)
        self.weights -= np.float32(hyper.lr / correction1) * (self.exp_avg / denom)

    async def push_pull(
        self, worker: int, clock: int, grad: np.ndarray, hyper: Hyper, based_on: int
    ) -> tuple[np.ndarray, int]:
        """Give the gradient of ``worker``'s step ``clock`` (0-based); get weights and version.

        ``based_on`` is the version of the weights the gradient was computed from (the version
        this shard returned to the worker last time).
        """
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"worker {worker} out of range 0..{self.num_workers - 1}")
        if grad.shape != self.weights.shape:
            raise ValueError(f"gradient of shape {grad.shape}; shard holds {self.weights.shape}")
        async with self._condition:
            if self.consistency == "sync":
                await self._sync_round(clock, grad, hyper)
            else:
                self._apply(grad, hyper)
                self.clocks[worker] = clock + 1
                self._condition.notify_all()
                if self.consistency == "ssp":
                    bound = clock + 1 - self.staleness
                    await self._condition.wait_for(lambda: min(self.clocks) >= bound)
            self.clocks[worker] = max(self.clocks[worker], clock + 1)
            event = Event(worker, clock + 1, min(self.clocks), self.version, based_on)
            self.events.append(event)
            return self.weights.copy(), self.version

    async def _sync_round(self, clock: int, grad: np.ndarray, hyper: Hyper) -> None:
        if clock != self.version:
            raise RuntimeError(
                f"sync: a gradient for step {clock} arrived while the shard is at step "
                f"{self.version}; every worker must push every step exactly once"
            )
        if self._round_sum is None:
            self._round_sum = np.array(grad, dtype=np.float32, copy=True)
        else:
            self._round_sum += grad
        self._round_count += 1
        if self._round_count == self.num_workers:
            self._apply(self._round_sum / np.float32(self.num_workers), hyper)
            self._round_sum, self._round_count = None, 0
            self._condition.notify_all()
        else:
            await self._condition.wait_for(lambda: self.version > clock)

    async def pull(self) -> tuple[np.ndarray, int]:
        return self.weights.copy(), self.version

    async def trace(self) -> list[dict[str, Any]]:
        """The recorded answers, oldest first."""
        return [asdict(e) for e in self.events]
