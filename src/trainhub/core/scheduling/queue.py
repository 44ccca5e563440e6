"""The queue of waiting trials, indexed so that a scheduling pass is cheap on long queues.

A policy must give every queued trial a decision, but it only has to *look* at a few of them:
trials of the same tenant, priority and request shape compete for the same capacity, so once
the first of them cannot start, none of the others behind it can either. :class:`TrialQueue`
keeps the queue as such groups, each sorted by the policy's :class:`QueueOrder`, so a pass
touches the head of each group and the trials it starts, not the whole queue.

A ``TrialQueue`` is an immutable :class:`~collections.abc.Sequence` of
:class:`~trainhub.core.scheduling.snapshot.QueuedTrial`: ``Snapshot.queue`` may be one (the
simulator keeps one up to date with ``added``/``removed``, which share the unchanged groups) or
a plain tuple, which a policy indexes itself with :meth:`TrialQueue.coerce`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, islice
from typing import NamedTuple, overload

from trainhub.core.resources import ResourceRequest
from trainhub.core.scheduling.snapshot import QueuedTrial
from trainhub.core.spec import Placement, Priority
from trainhub.core.topology import TopologyNeed

OrderKey = tuple[float, ...]


class Shape(NamedTuple):
    """What of a request decides where it fits: requests of one shape compete for capacity in
    the same way."""

    num_workers: int
    gpus_per_worker: int
    cpus_per_worker: float
    placement: Placement
    single_node: bool
    node_labels: tuple[tuple[str, str], ...]
    memory_gb_per_worker: float
    topology: TopologyNeed | None = None
    group_size: int = 1


class GroupKey(NamedTuple):
    """The trials of one tenant, priority and shape: they wait for the same capacity."""

    tenant: str
    neg_rank: int  # minus the priority's rank: higher priorities sort first
    shape: Shape


def shape_of(request: ResourceRequest) -> Shape:
    """A hashable key equal for requests that compete for capacity in the same way."""
    labels = request.node_labels
    return Shape(
        request.num_workers,
        request.gpus_per_worker,
        request.cpus_per_worker,
        request.placement,
        request.single_node,
        tuple(sorted(labels.items())) if labels else (),
        request.memory_gb_per_worker,
        request.topology,
        request.group_size,
    )


_RANK = {p: p.rank for p in Priority}


def group_of(trial: QueuedTrial) -> GroupKey:
    return GroupKey(trial.tenant, -_RANK[trial.priority], shape_of(trial.request))


@dataclass(frozen=True, eq=False)
class QueueOrder:
    """How a policy orders trials inside one group; the key must not depend on the clock.

    Two orders are the same only if they are the same object: a policy keeps one per instance.
    """

    name: str
    key: Callable[[QueuedTrial], OrderKey]


def _submission_key(trial: QueuedTrial) -> OrderKey:
    return (trial.submitted_at, trial.trial_id)


SUBMISSION_ORDER = QueueOrder("submission", _submission_key)


_CHUNK = 64


class Run(Sequence[QueuedTrial]):
    """An immutable sorted sequence of trials stored in chunks, so that a new version with one
    trial more or less copies one chunk and the chunk index, not the whole sequence."""

    __slots__ = ("_chunks", "_keys", "_len", "_starts")

    def __init__(
        self,
        chunks: tuple[tuple[QueuedTrial, ...], ...] = (),
        keys: tuple[tuple[OrderKey, ...], ...] = (),
    ) -> None:
        self._chunks = chunks
        self._keys = keys
        self._starts = list(accumulate(map(len, chunks), initial=0))
        self._len = self._starts.pop()

    @property
    def first(self) -> QueuedTrial:
        return self._chunks[0][0]

    @property
    def first_key(self) -> OrderKey:
        return self._keys[0][0]

    @classmethod
    def of_sorted(cls, items: Sequence[tuple[OrderKey, QueuedTrial]]) -> Run:
        chunks = tuple(
            tuple(t for _, t in items[i : i + _CHUNK]) for i in range(0, len(items), _CHUNK)
        )
        keys = tuple(
            tuple(k for k, _ in items[i : i + _CHUNK]) for i in range(0, len(items), _CHUNK)
        )
        return cls(chunks, keys)

    def _locate(self, key: OrderKey, right: bool) -> tuple[int, int]:
        """(chunk, position in chunk) where ``key`` sorts."""
        keys = self._keys
        if not keys:
            return 0, 0
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi) // 2
            if (keys[mid][-1] < key) if not right else (keys[mid][-1] <= key):
                lo = mid + 1
            else:
                hi = mid
        chunk = min(lo, len(keys) - 1)
        find = bisect.bisect_right if right else bisect.bisect_left
        return chunk, find(keys[chunk], key)

    def key_at(self, index: int) -> OrderKey:
        """The order key of ``self[index]``."""
        if index < len(self._keys[0]):
            return self._keys[0][index]
        c = bisect.bisect_right(self._starts, index) - 1
        return self._keys[c][index - self._starts[c]]

    def bisect_left(self, key: OrderKey) -> int:
        """The position of the first trial whose order key is not below ``key``."""
        c, at = self._locate(key, right=False)
        if not self._chunks:
            return 0
        return self._starts[c] + at

    def view(self, start: int, stop: int) -> RunView:
        return RunView(self, start, stop)

    def inserted(self, key: OrderKey, trial: QueuedTrial) -> Run:
        if not self._chunks:
            return Run(((trial,),), ((key,),))
        c, at = self._locate(key, right=True)
        chunk, ckeys = self._chunks[c], self._keys[c]
        chunk = (*chunk[:at], trial, *chunk[at:])
        ckeys = (*ckeys[:at], key, *ckeys[at:])
        if len(chunk) > 2 * _CHUNK:
            half = len(chunk) // 2
            new_chunks: tuple[tuple[QueuedTrial, ...], ...] = (chunk[:half], chunk[half:])
            new_keys: tuple[tuple[OrderKey, ...], ...] = (ckeys[:half], ckeys[half:])
        else:
            new_chunks, new_keys = (chunk,), (ckeys,)
        return Run(
            self._chunks[:c] + new_chunks + self._chunks[c + 1 :],
            self._keys[:c] + new_keys + self._keys[c + 1 :],
        )

    def without(self, key: OrderKey, trial: QueuedTrial) -> Run:
        c, at = self._locate(key, right=False)
        chunks, keys = self._chunks, self._keys
        while chunks[c][at] is not trial:
            at += 1
            if at == len(chunks[c]):
                c, at = c + 1, 0
        chunk = chunks[c][:at] + chunks[c][at + 1 :]
        ckeys = keys[c][:at] + keys[c][at + 1 :]
        if chunk:
            return Run((*chunks[:c], chunk, *chunks[c + 1 :]), (*keys[:c], ckeys, *keys[c + 1 :]))
        return Run(chunks[:c] + chunks[c + 1 :], keys[:c] + keys[c + 1 :])

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[QueuedTrial]:
        return chain.from_iterable(self._chunks)

    def iter_range(self, start: int, stop: int) -> Iterator[QueuedTrial]:
        """``iter(self[start:stop])`` without copying or indexing trial by trial."""
        if start >= stop:
            return iter(())
        c = bisect.bisect_right(self._starts, start) - 1
        first = self._chunks[c][start - self._starts[c] :]
        return islice(chain(first, chain.from_iterable(self._chunks[c + 1 :])), stop - start)

    @overload
    def __getitem__(self, index: int) -> QueuedTrial: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[QueuedTrial]: ...
    def __getitem__(self, index: int | slice) -> QueuedTrial | Sequence[QueuedTrial]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(index)
        if index < len(self._chunks[0]):
            return self._chunks[0][index]
        c = bisect.bisect_right(self._starts, index) - 1
        return self._chunks[c][index - self._starts[c]]


class RunView(Sequence[QueuedTrial]):
    """``run[start:stop]`` without copying."""

    __slots__ = ("_run", "_start", "_stop")

    def __init__(self, run: Run, start: int, stop: int) -> None:
        self._run, self._start, self._stop = run, start, stop

    def __len__(self) -> int:
        return max(0, self._stop - self._start)

    def __iter__(self) -> Iterator[QueuedTrial]:
        return self._run.iter_range(self._start, self._stop)

    @overload
    def __getitem__(self, index: int) -> QueuedTrial: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[QueuedTrial]: ...
    def __getitem__(self, index: int | slice) -> QueuedTrial | Sequence[QueuedTrial]:
        if isinstance(index, slice):
            return tuple(self._run[i] for i in range(self._start, self._stop))[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._run[self._start + index]


class TrialQueue(Sequence[QueuedTrial]):
    """Queued trials grouped by (tenant, priority, request shape), each group in ``order``."""

    __slots__ = ("_groups", "_len", "order")

    def __init__(self, trials: Iterable[QueuedTrial] = (), order: QueueOrder = SUBMISSION_ORDER):
        self.order = order
        buckets: dict[GroupKey, list[tuple[OrderKey, QueuedTrial]]] = {}
        count = 0
        for trial in trials:
            buckets.setdefault(group_of(trial), []).append((order.key(trial), trial))
            count += 1
        groups: dict[GroupKey, Run] = {}
        for group, items in buckets.items():
            items.sort(key=lambda item: item[0])
            groups[group] = Run.of_sorted(items)
        self._groups = groups
        self._len = count

    @classmethod
    def coerce(cls, queue: Sequence[QueuedTrial], order: QueueOrder) -> TrialQueue:
        """``queue`` itself when it is already indexed in ``order``, else a new index of it."""
        if isinstance(queue, TrialQueue) and queue.order is order:
            return queue
        return cls(queue, order)

    @property
    def groups(self) -> Mapping[GroupKey, Run]:
        """Non-empty groups; each is sorted by ``order``."""
        return self._groups

    def added(self, trials: Iterable[QueuedTrial]) -> TrialQueue:
        """A new queue with ``trials`` added (ids must not be queued already)."""
        groups = dict(self._groups)
        count = self._len
        for trial in trials:
            group = group_of(trial)
            groups[group] = groups.get(group, _EMPTY).inserted(self.order.key(trial), trial)
            count += 1
        return self._derive(groups, count)

    def removed(self, trials: Iterable[QueuedTrial]) -> TrialQueue:
        """A new queue without ``trials`` (the queued objects themselves, as found in groups)."""
        groups = dict(self._groups)
        count = self._len
        for trial in trials:
            group = group_of(trial)
            run = groups[group].without(self.order.key(trial), trial)
            if len(run):
                groups[group] = run
            else:
                del groups[group]
            count -= 1
        return self._derive(groups, count)

    def _derive(self, groups: dict[GroupKey, Run], count: int) -> TrialQueue:
        new = TrialQueue.__new__(TrialQueue)
        new.order = self.order
        new._groups = groups
        new._len = count
        return new

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[QueuedTrial]:
        return chain.from_iterable(self._groups[g] for g in sorted(self._groups, key=repr))

    @overload
    def __getitem__(self, index: int) -> QueuedTrial: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[QueuedTrial]: ...
    def __getitem__(self, index: int | slice) -> QueuedTrial | Sequence[QueuedTrial]:
        # positional access is rare (debugging, tests); it materialises the queue
        return tuple(self)[index]

    def __repr__(self) -> str:
        return f"TrialQueue({len(self)} trials in {len(self._groups)} groups, {self.order.name})"


_EMPTY = Run()


class QueueIndex:
    """A :class:`TrialQueue` kept in step with a queue its caller reads afresh on every tick.

    :meth:`sync` returns a queue with exactly the given trials, re-indexing only those that are
    new or changed since the last call and sharing every untouched group with the previous
    queue. Passing the same ``QueuedTrial`` object for an unchanged trial makes the comparison
    an identity check (the control plane caches one per database row until the row changes);
    equal copies work too, at the price of a field-by-field comparison.
    """

    __slots__ = ("_by_id", "queue")

    def __init__(self, order: QueueOrder = SUBMISSION_ORDER) -> None:
        self.queue = TrialQueue((), order)
        self._by_id: dict[int, QueuedTrial] = {}

    def sync(self, trials: Iterable[QueuedTrial]) -> TrialQueue:
        fresh = {t.trial_id: t for t in trials}
        known = self._by_id
        gone = [t for i, t in known.items() if _changed(fresh.get(i), t)]
        came = [t for i, t in fresh.items() if _changed(known.get(i), t)]
        if len(gone) + len(came) > len(fresh) // 2:
            # mostly new: indexing from scratch is cheaper; the index holds these objects now
            self.queue = TrialQueue(fresh.values(), self.queue.order)
            self._by_id = fresh
            return self.queue
        if gone or came:
            # removal finds a trial by identity: ``gone`` holds the objects the queue holds
            self.queue = self.queue.removed(gone).added(came)
        for t in gone:
            del known[t.trial_id]
        for t in came:
            known[t.trial_id] = t
        return self.queue


def _changed(before: QueuedTrial | None, now: QueuedTrial) -> bool:
    return before is not now and before != now
