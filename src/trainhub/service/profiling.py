"""Profiling a running trial: a user asks for N steps; every rank of the trial's runtime sees
the request (it polls with the trial's token), runs torch.profiler for its next N steps, and
uploads its top operators and its Chrome/Perfetto trace. The profile is done when every rank
of the attempt has uploaded.

States: REQUESTED (no rank has answered) -> RUNNING (some ranks uploaded) -> DONE (every
rank's trace is in);
a profile still open when its trial stops running (or after ``expire_s``) is FAILED. One open
profile per trial at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from trainhub.core import limits
from trainhub.core.errors import Conflict, InvalidRequest, NotFound, PermissionDenied, TooLarge
from trainhub.core.states import TrialState
from trainhub.service.auth import check_trial_scope
from trainhub.service.clock import Clock
from trainhub.service.ports import ArtifactStore, Principal
from trainhub.service.records import Trial
from trainhub.service.repository import UnitOfWork

EXPIRE_S = 3600.0  # a profile no rank finished within this is given up


class ProfileState(StrEnum):
    REQUESTED = "REQUESTED"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"


@dataclass(frozen=True)
class RankProfile:
    rank: int
    top_ops: list[dict[str, Any]]  # name, calls, self_cpu_ms, cpu_total_ms, self_device_ms
    trace_key: str | None
    trace_bytes: int
    uploaded_at: float


@dataclass(frozen=True)
class Profile:
    id: int
    trial_id: int
    tenant: str
    steps: int
    state: ProfileState
    requested_by: str
    requested_at: float
    attempt: int  # the attempt asked; its ranks answer
    world_size: int
    detail: str = ""
    ranks: list[RankProfile] = field(default_factory=list)


class ProfileStore(Protocol):
    """Port: profiles and their per-rank results (adapters/db/profile_store.py)."""

    def add_profile(self, profile: Profile) -> Profile: ...

    def get_profile(self, profile_id: int) -> Profile | None: ...

    def list_profiles(self, trial_id: int, limit: int) -> list[Profile]: ...

    def set_state(self, profile_id: int, state: ProfileState, detail: str = "") -> None: ...

    def put_rank(self, profile_id: int, result: RankProfile) -> None:
        """Insert or replace one rank's result (a retried upload replaces)."""
        ...


def trace_key(tenant: str, trial_id: int, profile_id: int, rank: int) -> str:
    return f"tenants/{tenant}/trials/{trial_id}/profiles/{profile_id}/rank{rank}.trace.json.gz"


def _clean_ops(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(ops) > limits.MAX_PROFILE_OPS:
        raise TooLarge(f"{len(ops)} operators; the limit is {limits.MAX_PROFILE_OPS}")
    clean = []
    for i, op in enumerate(ops):
        name = op.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"top_ops.{i}.name: a non-empty string is required")
        row: dict[str, Any] = {"name": name[: limits.MAX_PROFILE_OP_NAME_CHARS]}
        calls = op.get("calls", 0)
        row["calls"] = calls if isinstance(calls, int) and 0 <= calls < 2**62 else 0
        for key in ("self_cpu_ms", "cpu_total_ms", "self_device_ms", "device_total_ms"):
            value = op.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                if not 0 <= value < 1e12:
                    raise InvalidRequest(f"top_ops.{i}.{key}: must be in 0..1e12 ms")
                row[key] = float(value)
        clean.append(row)
    return clean


class ProfilingService:
    def __init__(
        self,
        uow: UnitOfWork,
        profiles: ProfileStore,
        store: ArtifactStore,
        clock: Clock,
        expire_s: float = EXPIRE_S,
    ) -> None:
        self.uow = uow
        self.profiles = profiles
        self.store = store
        self.clock = clock
        self.expire_s = expire_s

    # ------------------------------------------------------------ users
    def request(self, principal: Principal, trial_id: int, steps: int) -> Profile:
        """Ask the trial's ranks to profile their next ``steps`` steps."""
        if principal.trial_id is not None:
            raise PermissionDenied("a trial's token cannot ask for a profile")
        if not 1 <= steps <= limits.MAX_PROFILE_STEPS:
            raise InvalidRequest(
                f"steps: {steps} is not in 1..{limits.MAX_PROFILE_STEPS}",
                "a few dozen steps show where the time goes",
            )
        trial, attempt, world = self._running(principal, trial_id, write=True)
        open_profile = self._open(trial_id)
        if open_profile is not None:
            raise Conflict(
                f"profile {open_profile.id} of trial {trial_id} is still {open_profile.state}",
                "wait for it (trainhub profile shows it) before asking again",
            )
        return self.profiles.add_profile(
            Profile(
                id=0,
                trial_id=trial_id,
                tenant=trial.tenant,
                steps=steps,
                state=ProfileState.REQUESTED,
                requested_by=principal.username or "admin",
                requested_at=self.clock(),
                attempt=attempt,
                world_size=world,
            )
        )

    def list_profiles(self, principal: Principal, trial_id: int, limit: int = 20) -> list[Profile]:
        self._trial(principal, trial_id, write=False)
        self._expire(trial_id)
        return self.profiles.list_profiles(trial_id, limit)

    def get(self, principal: Principal, trial_id: int, profile_id: int) -> Profile:
        self._trial(principal, trial_id, write=False)
        self._expire(trial_id)
        profile = self.profiles.get_profile(profile_id)
        if profile is None or profile.trial_id != trial_id:
            raise NotFound(f"trial {trial_id} has no profile {profile_id}")
        return profile

    def trace(self, principal: Principal, trial_id: int, profile_id: int, rank: int) -> bytes:
        """One rank's trace (gzip-compressed Chrome trace JSON: opens in Perfetto)."""
        profile = self.get(principal, trial_id, profile_id)
        found = [r for r in profile.ranks if r.rank == rank and r.trace_key]
        if not found or found[0].trace_key is None:
            raise NotFound(f"profile {profile_id} has no trace of rank {rank}")
        return self.store.get(found[0].trace_key)

    # ------------------------------------------------------------ the runtime
    def pending(self, principal: Principal, trial_id: int) -> Profile | None:
        """The open profile a rank of the trial should run (the runtime polls this)."""
        self._trial(principal, trial_id, write=False)
        self._expire(trial_id)
        return self._open(trial_id)

    def upload(
        self,
        principal: Principal,
        trial_id: int,
        profile_id: int,
        rank: int,
        top_ops: list[dict[str, Any]],
        trace: bytes | None,
    ) -> Profile:
        """One rank's result: its top operators and (optionally) its trace file."""
        if principal.trial_id is None and not principal.is_admin:
            raise PermissionDenied(f"only trial {trial_id}'s own runtime uploads its profiles")
        profile = self.get(principal, trial_id, profile_id)
        if profile.state in (ProfileState.DONE, ProfileState.FAILED):
            raise Conflict(f"profile {profile_id} is {profile.state}; it takes no more results")
        if not 0 <= rank < profile.world_size:
            raise InvalidRequest(
                f"rank {rank} is not in 0..{profile.world_size - 1} (attempt {profile.attempt})"
            )
        ops = _clean_ops(top_ops)
        key = None
        if trace is not None:
            if len(trace) > limits.MAX_PROFILE_TRACE_BYTES:
                raise TooLarge(
                    f"the trace is {len(trace)} bytes; the limit is "
                    f"{limits.MAX_PROFILE_TRACE_BYTES}",
                    "profile fewer steps",
                )
            key = trace_key(profile.tenant, trial_id, profile_id, rank)
            self.store.put(key, trace)
        self.profiles.put_rank(
            profile_id, RankProfile(rank, ops, key, len(trace or b""), self.clock())
        )
        # a rank is done once its trace is in (it sends its table first)
        done = {r.rank for r in profile.ranks if r.trace_key and r.rank != rank}
        if key is not None:
            done.add(rank)
        state = ProfileState.DONE if len(done) >= profile.world_size else ProfileState.RUNNING
        self.profiles.set_state(profile_id, state)
        return self.get(principal, trial_id, profile_id)

    # ------------------------------------------------------------ helpers
    def _trial(self, principal: Principal, trial_id: int, write: bool) -> Trial:
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_trial_scope(principal, trial_id, trial.tenant, write)
            return trial

    def _running(self, principal: Principal, trial_id: int, write: bool) -> tuple[Trial, int, int]:
        trial = self._trial(principal, trial_id, write)
        with self.uow() as repo:
            attempts = repo.list_attempts(trial_id)
        if trial.state != TrialState.RUNNING or not attempts:
            raise Conflict(
                f"trial {trial_id} is {trial.state}: only a running trial can be profiled",
                "profile it while it runs",
            )
        latest = attempts[-1]
        return trial, latest.number, max(1, len(latest.placement))

    def _open(self, trial_id: int) -> Profile | None:
        for profile in self.profiles.list_profiles(trial_id, 5):
            if profile.state in (ProfileState.REQUESTED, ProfileState.RUNNING):
                return profile
        return None

    def _expire(self, trial_id: int) -> None:
        """Give up an open profile whose trial stopped running or that waited too long."""
        profile = self._open(trial_id)
        if profile is None:
            return
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            attempts = repo.list_attempts(trial_id)
        latest = attempts[-1].number if attempts else None
        why = ""
        if trial is None or trial.state != TrialState.RUNNING or latest != profile.attempt:
            why = "the trial stopped running before every rank answered"
        elif self.clock() - profile.requested_at > self.expire_s:
            why = (
                f"not every rank answered within {self.expire_s:.0f} s: does the script call "
                "ctx.profile_step() every step?"
            )
        if why:
            self.profiles.set_state(profile.id, ProfileState.FAILED, why)
