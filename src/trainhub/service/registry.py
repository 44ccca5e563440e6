"""The model registry: versioned models made from trials' checkpoints, shared between tenants.

A model belongs to one tenant and has versions 1, 2, ...; each version holds a copy of the
weights (a checkpoint file, copied in the artifact store, so retention of the trial's
checkpoints never deletes it), the architecture that builds it (the spec's ``model.arch``:
zoo name and arguments), metrics, hyperparameters and lineage (experiment, trial, checkpoint,
data, and the version it was compressed from). Members of the owning tenant read and register;
its tenant admins share a model with other tenants, whose members may then read it and start
trainings from it; cluster admins see all (docs/adr/0015-model-registry.md).

A spec's ``model.init_from`` and ``distill.teacher`` are resolved here at submit
(:meth:`pin_sources`, one lookup for both): a name is pinned to its latest version, a model
the submitting tenant cannot see (or a trial of another tenant) is refused with the field's
path. The trial's runtime then downloads the weights with its own token (:meth:`init_weights`,
:meth:`teacher_weights`), checked again.
"""

from __future__ import annotations

import uuid as uuid_lib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainhub.core import limits
from trainhub.core.errors import (
    Conflict,
    FieldError,
    InvalidRequest,
    InvalidSpec,
    NotFound,
    QuotaExceeded,
)
from trainhub.core.model_spec import ModelRef, parse_model_ref, zoo_error
from trainhub.core.spec import ExperimentSpec
from trainhub.core.states import TrialState
from trainhub.core.tenant_assets import pick_version
from trainhub.service.auth import check_read, check_trial_scope, check_write, require_user
from trainhub.service.clock import Clock
from trainhub.service.keys import is_checkpoint_set
from trainhub.service.ports import ArtifactStore, Principal
from trainhub.service.records import Checkpoint
from trainhub.service.repository import UnitOfWork
from trainhub.service.tenant_assets import TenantAssets, readable_tenants
from trainhub.service.tracking import StorageQuota, refuse_set


@dataclass(frozen=True)
class ModelVersion:
    id: int
    model: str
    tenant: str
    version: int
    storage_key: str
    size_bytes: int
    arch: dict[str, Any]
    metrics: dict[str, Any]
    hparams: dict[str, Any]
    lineage: dict[str, Any]
    created_at: float
    created_by: str
    # whether the weights load into ``arch``: None where not checked (no zoo architecture,
    # or registered before the check and not re-checked yet); what does not fit, if not
    weights_fit: bool | None = None
    weights_problem: str = ""

    @property
    def ref(self) -> str:
        return f"{self.tenant}/{self.model}:{self.version}"


@dataclass(frozen=True)
class RegisteredModel:
    id: int
    name: str
    tenant: str
    description: str
    created_at: float
    created_by: str
    shared_with: tuple[str, ...] = ()
    versions: tuple[ModelVersion, ...] = field(default=())

    @property
    def latest(self) -> ModelVersion | None:
        return max(self.versions, key=lambda v: v.version) if self.versions else None


@dataclass(frozen=True)
class NewVersion:
    """What a version is made of, besides its weights."""

    arch: dict[str, Any]
    metrics: dict[str, Any]
    hparams: dict[str, Any]
    lineage: dict[str, Any]
    weights_fit: bool | None = None  # checked at registration: True, or None (not checkable)


class ModelStore(Protocol):
    """Models, versions and shares in the database (``adapters/db/registry_store.py``)."""

    def find_models(self, name: str, tenant: str | None = None) -> list[RegisteredModel]:
        """Models called ``name`` (in ``tenant`` only, if given), with versions and shares."""
        ...

    def list_models(self, tenants: Sequence[str] | None, limit: int) -> list[RegisteredModel]:
        """Models owned by or shared with ``tenants`` (all when None), by name."""
        ...

    def add_version(
        self,
        tenant: str,
        name: str,
        description: str,
        storage_key: str,
        size_bytes: int,
        new: NewVersion,
        created_by: str,
        now: float,
    ) -> ModelVersion:
        """Create the model if it does not exist, then its next version."""
        ...

    def set_share(self, model_id: int, tenant: str, shared: bool) -> None: ...

    def bytes_of_tenant(self, tenant: str) -> int:
        """Bytes of every version of the tenant's models."""
        ...

    def delete_version(self, version_id: int, now: float) -> None:
        """Mark a version deleted: it is listed no more, and its number is never reused."""
        ...

    def unchecked_versions(self, after_id: int, limit: int) -> list[ModelVersion]:
        """Versions (not deleted) whose weights were never checked, by id, after ``after_id``."""
        ...

    def set_weights_fit(self, version_id: int, fit: bool, problem: str) -> None:
        """Record whether a version's weights load into its architecture (and why not)."""
        ...


class WeightsCheck(Protocol):
    """Loads a checkpoint into the architecture a version declares
    (``adapters/weights_check.py``: torch and the model zoo live there)."""

    def mismatch(self, arch: Mapping[str, Any], weights: bytes) -> str | None:
        """What does not fit (missing, unexpected and misshapen tensors, named), or None."""
        ...


def _latest_checkpoint(checkpoints: list[Checkpoint]) -> Checkpoint | None:
    return max(checkpoints, key=lambda c: (c.step, c.id)) if checkpoints else None


def _model_key(tenant: str, name: str) -> str:
    return f"tenants/{tenant}/models/{name}/{uuid_lib.uuid4().hex}.ckpt"


class RegistryService:
    def __init__(
        self,
        uow: UnitOfWork,
        models: ModelStore,
        store: ArtifactStore,
        clock: Clock,
        weights_check: WeightsCheck | None = None,
    ) -> None:
        self.uow = uow
        self.models = models
        self.store = store
        self.clock = clock
        self.weights_check = weights_check
        self.assets: TenantAssets[RegisteredModel] = TenantAssets(
            uow,
            models.find_models,
            models.set_share,
            kind="model",
            listing="trainhub models ls",
            share_limit=limits.MAX_MODEL_SHARES,
        )

    # --- reading ---

    def _find(self, ref: ModelRef, tenants: Sequence[str] | None, what: str) -> RegisteredModel:
        """The one model ``ref`` names among those ``tenants`` see (the owner's first)."""
        assert ref.name is not None
        return self.assets.find(ref.name, ref.tenant, tenants, what, ref=str(ref))

    def _version(self, model: RegisteredModel, version: int | None) -> ModelVersion:
        return pick_version(model.versions, "model", model.name, version)

    def list_models(self, principal: Principal, limit: int = 100) -> list[RegisteredModel]:
        require_user(principal)
        limit = max(1, min(limit, limits.MAX_MODELS_LISTED))
        return self.models.list_models(readable_tenants(principal), limit)

    def get_model(self, principal: Principal, name: str, tenant: str | None) -> RegisteredModel:
        require_user(principal)
        ref = _ref(name, tenant)
        return self.assets.hide_shares(principal, self._find(ref, readable_tenants(principal), ""))

    def get_version(
        self, principal: Principal, name: str, version: int | None, tenant: str | None
    ) -> ModelVersion:
        return self._version(self.get_model(principal, name, tenant), version)

    def version_chunks(
        self, principal: Principal, name: str, version: int | None, tenant: str | None
    ) -> tuple[ModelVersion, Iterator[bytes]]:
        found = self.get_version(principal, name, version, tenant)
        return found, self.store.iter_chunks(found.storage_key)

    # --- writing ---

    def register(
        self,
        principal: Principal,
        trial_id: int,
        name: str,
        *,
        checkpoint_id: int | None = None,
        description: str = "",
        arch: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
    ) -> ModelVersion:
        """A new version of model ``name`` (in the trial's tenant) from a checkpoint of the
        trial: the one given, or its latest. ``arch`` overrides the spec's ``model.arch``;
        ``metrics`` and ``lineage`` add to what the trial recorded."""
        require_user(principal)
        ref = _ref(name, None)
        if len(description) > limits.MAX_MODEL_DESCRIPTION_CHARS:
            raise InvalidRequest(
                f"the description has {len(description)} characters; the limit is "
                f"{limits.MAX_MODEL_DESCRIPTION_CHARS}"
            )
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_write(principal, trial.tenant, f"trial {trial_id}")
            experiment = repo.experiment_of(trial_id)
            checkpoints = repo.list_checkpoints(trial_id)
            tenant = repo.get_tenant(trial.tenant)
            checkpoint_bytes = repo.checkpoint_bytes_by_tenant().get(trial.tenant, 0)
        if checkpoint_id is None:
            checkpoint = _latest_checkpoint(checkpoints)
            if checkpoint is None:
                raise Conflict(
                    f"trial {trial_id} has no checkpoint to register",
                    "save one with ctx.save_checkpoint(...) in the script",
                )
        else:
            matching = [c for c in checkpoints if c.id == checkpoint_id]
            if not matching:
                raise NotFound(f"checkpoint {checkpoint_id} of trial {trial_id} does not exist")
            checkpoint = matching[0]
        assert tenant is not None
        quota = StorageQuota.of(tenant).max_storage_bytes
        used = checkpoint_bytes + self.models.bytes_of_tenant(trial.tenant)
        if used + checkpoint.size_bytes > quota:
            raise QuotaExceeded(
                f"a model version of {checkpoint.size_bytes} bytes does not fit in tenant "
                f"{trial.tenant!r}'s storage quota of {quota} bytes ({max(0, quota - used)} left; "
                "registered models count with checkpoints)",
                "delete old checkpoints or ask an admin to raise the quota",
            )
        unknown_zoo = arch and zoo_error(arch.get("zoo"), "arch.zoo")
        if unknown_zoo:
            raise InvalidSpec([unknown_zoo])
        spec = ExperimentSpec.model_validate(experiment.spec)
        spec_arch = spec.model.arch.model_dump(mode="json") if spec.model.arch else {}
        fits = self._check_weights(dict(arch) if arch else spec_arch, checkpoint, arch is not None)
        recorded = {**trial.latest_metrics, **checkpoint.metrics}
        recorded.pop("step", None)
        new = NewVersion(
            arch=dict(arch) if arch else spec_arch,
            metrics={**recorded, **(metrics or {})},
            hparams=dict(trial.hparams),
            lineage={
                "experiment_id": experiment.id,
                "experiment": experiment.name,
                "project": experiment.project,
                "trial_id": trial_id,
                "checkpoint_id": checkpoint.id,
                "checkpoint_step": checkpoint.step,
                "data": trial.hparams.get("dataset", trial.hparams.get("data")),
                "init_from": spec.model.init_from,
                **(lineage or {}),
            },
            weights_fit=fits,
        )
        # the weights are copied before the transaction opens (as checkpoint uploads are)
        key = _model_key(trial.tenant, ref.name or name)
        refuse_set(checkpoint)
        writer = self.store.open_writer(key)
        try:
            for chunk in self.store.iter_chunks(checkpoint.storage_key):
                writer.write(chunk)
            size = writer.commit()
        except BaseException:
            writer.abort()
            raise
        try:
            return self.models.add_version(
                trial.tenant,
                ref.name or name,
                description,
                key,
                size,
                new,
                principal.username,
                self.clock(),
            )
        except BaseException:
            self.store.delete(key)
            raise

    def _check_weights(
        self, arch: Mapping[str, Any], checkpoint: Checkpoint, given: bool
    ) -> bool | None:
        """Refuse weights that do not load into the declared architecture (the export and every
        training started from the version would fail later), naming the tensors. True when
        they load; None when there is nothing to check them against."""
        if self.weights_check is None or not arch.get("zoo"):
            return None
        data = b"".join(self.store.iter_chunks(checkpoint.storage_key))
        problem = self.weights_check.mismatch(arch, data)
        if problem is None:
            return True
        where = "arch" if given else "model.arch"
        raise InvalidSpec(
            [
                FieldError(
                    where,
                    f"checkpoint {checkpoint.id} (step {checkpoint.step}) does not load into "
                    f"{arch.get('zoo')} {dict(arch.get('args') or {})}: {problem}",
                    "declare the architecture that made the weights (--arch, or the spec's "
                    "model.arch), or build the model with trainhub.models.create(...) in the "
                    "script",
                )
            ]
        )

    def recheck_weights(self, batch: int = 50) -> dict[str, int]:
        """Check the versions whose weights were never checked against their architecture
        (registered before registration checked them), and record the answer: ``trainhub
        models suggest`` ranks no version whose weights do not load, and ``models show`` says
        why. The server runs this once after it starts; versions without a zoo architecture
        have nothing to be checked against and stay unchecked. Returns how many fit and not."""
        counts = {"fit": 0, "misfit": 0}
        if self.weights_check is None:
            return counts
        after = 0
        while versions := self.models.unchecked_versions(after, batch):
            after = versions[-1].id
            for version in versions:
                if not version.arch.get("zoo"):
                    continue
                try:
                    data = b"".join(self.store.iter_chunks(version.storage_key))
                except NotFound:
                    problem: str | None = "its weights are missing from the artifact store"
                else:
                    problem = self.weights_check.mismatch(version.arch, data)
                self.models.set_weights_fit(version.id, problem is None, problem or "")
                counts["fit" if problem is None else "misfit"] += 1
        return counts

    def delete_version(
        self, principal: Principal, name: str, version: int, tenant: str | None
    ) -> ModelVersion:
        """Delete one version (its weights too), refused while an unfinished trial starts or
        distils from it; its number is never given to another version."""
        require_user(principal)
        model = self._find(_ref(name, tenant), readable_tenants(principal), "")
        check_write(principal, model.tenant, f"model {model.name}")
        found = self._version(model, version)
        unfinished = [s for s in TrialState if not s.is_terminal]
        with self.uow() as repo:
            trials = repo.trials_in_states(unfinished)
            specs = repo.experiment_specs(sorted({t.experiment_id for t in trials}))
        pinned = [t.id for t in trials if _pins(specs.get(t.experiment_id) or {}, found.ref)]
        if pinned:
            listed = ", ".join(f"trial {i}" for i in pinned[:5])
            raise Conflict(
                f"{found.ref} is in use: {listed} start(s) or distil(s) from it",
                "delete it once they have ended, or cancel them (trainhub cancel --trial ID)",
            )
        self.models.delete_version(found.id, self.clock())
        self.store.delete(found.storage_key)
        return found

    def share(
        self, principal: Principal, name: str, tenant: str, shared: bool, owner: str | None = None
    ) -> RegisteredModel:
        """Share model ``name`` with ``tenant`` (or stop): tenant admins of its owner only."""
        model = self.get_model(principal, name, owner)
        self.assets.share(principal, model, name, tenant, shared)
        return self.get_model(principal, name, model.tenant)

    # --- starting a training from a model, distilling from a teacher ---

    def pin_sources(
        self, principal: Principal, tenant: str, spec: ExperimentSpec
    ) -> ExperimentSpec:
        """Check the weights a submission into ``tenant`` names (``model.init_from``,
        ``distill.teacher``) and pin a model name to its latest version
        (``TENANT/NAME:VERSION``); 422 with the field's path when the model or trial does not
        exist or ``tenant`` may not read it."""
        for field_path in WEIGHTS_FIELDS:
            ref = source_ref(spec, field_path)
            if ref is not None:
                found = self._source(ref, tenant, principal, field_path)
                spec = _pinned(spec, field_path, found.ref)
        return spec

    def init_weights(self, principal: Principal, trial_id: int) -> tuple[int, Iterator[bytes]]:
        """The weights trial ``trial_id`` starts from (its spec's ``model.init_from``), for its
        own runtime (or a reader of its tenant): size and chunks."""
        return self.trial_weights(principal, trial_id, "model.init_from")

    def teacher_weights(self, principal: Principal, trial_id: int) -> tuple[int, Iterator[bytes]]:
        """The weights of the teacher trial ``trial_id`` distils from (``distill.teacher``)."""
        return self.trial_weights(principal, trial_id, "distill.teacher")

    def trial_weights(
        self, principal: Principal, trial_id: int, field_path: str
    ) -> tuple[int, Iterator[bytes]]:
        """The weights trial ``trial_id``'s spec names at ``field_path``, for its own runtime
        (or a reader of its tenant), checked again (an unshare stops later downloads)."""
        found = self.trial_weights_source(principal, trial_id, field_path)
        return found.size_bytes, self.store.iter_chunks(found.storage_key)

    def trial_weights_source(
        self, principal: Principal, trial_id: int, field_path: str
    ) -> WeightsSource:
        """Where the weights of :meth:`trial_weights` are (a presigned URL reads them)."""
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_trial_scope(principal, trial_id, trial.tenant, write=False)
            spec = ExperimentSpec.model_validate(repo.experiment_of(trial_id).spec)
        ref = source_ref(spec, field_path)
        if ref is None:
            raise NotFound(f"trial {trial_id} {_NOTHING_AT[field_path]}")
        try:
            found = self._source(ref, trial.tenant, None, field_path)
        except InvalidSpec as exc:
            raise NotFound(exc.errors[0].message, exc.errors[0].hint) from None
        return found

    def _source(
        self, ref: ModelRef, tenant: str, principal: Principal | None, field_path: str
    ) -> WeightsSource:
        """The weights ``ref`` names for a trial of ``tenant``: a version of a model ``tenant``
        owns or is shared, or the latest checkpoint of a trial of ``tenant`` (that
        ``principal``, if given, reads).

        Raises:
            InvalidSpec: at ``field_path``, saying why ``ref`` cannot be had.
        """

        def refuse(message: str, hint: str) -> InvalidSpec:
            return InvalidSpec([FieldError(field_path, message, hint)])

        if ref.trial_id is not None:
            with self.uow() as repo:
                trial = repo.get_trial(ref.trial_id)
                visible = trial is not None and trial.tenant == tenant
                if visible and principal is not None:
                    try:
                        check_read(principal, tenant, f"trial {ref.trial_id}")
                    except NotFound:
                        visible = False
                if not visible:
                    raise refuse(
                        f"trial {ref.trial_id} does not exist in tenant {tenant!r}",
                        "a trial of another tenant is not reachable: register it as a model "
                        "and share it",
                    )
                checkpoint = _latest_checkpoint(repo.list_checkpoints(ref.trial_id))
            if checkpoint is None:
                raise refuse(
                    f"trial {ref.trial_id} has no checkpoint yet", "pick a trial that saved one"
                )
            if is_checkpoint_set(checkpoint.storage_key):
                raise refuse(
                    f"trial {ref.trial_id}'s latest checkpoint is sharded (memory.fsdp): one "
                    "file per rank, not one set of weights",
                    "start from a registered model, or a trial that saves one-file checkpoints",
                )
            return WeightsSource(str(ref), checkpoint.size_bytes, checkpoint.storage_key)
        try:
            model = self._find(ref, [tenant], f" or is not shared with tenant {tenant!r}")
            version = self._version(model, ref.version)
        except (NotFound, InvalidRequest) as exc:
            raise refuse(exc.message, exc.hint or "see `trainhub models ls`") from None
        return WeightsSource(version.ref, version.size_bytes, version.storage_key)


@dataclass(frozen=True)
class WeightsSource:
    """Where the weights a spec names are: ``ref`` pinned (``TENANT/NAME:VERSION`` or
    ``trial:ID``), their size and storage key."""

    ref: str
    size_bytes: int
    storage_key: str


# the spec's fields that name weights a trial fetches: init-weights, teacher-weights
WEIGHTS_FIELDS = ("model.init_from", "distill.teacher")
_NOTHING_AT = {
    "model.init_from": "starts from no model (its spec has no init_from)",
    "distill.teacher": "distils from no teacher (no distill section)",
}


def _pins(spec: Mapping[str, Any], ref: str) -> bool:
    """Whether a stored spec names the pinned version ``ref`` (``TENANT/NAME:V``)."""
    model = spec.get("model") or {}
    distill = spec.get("distill") or {}
    return ref in (model.get("init_from"), distill.get("teacher"))


def source_ref(spec: ExperimentSpec, field_path: str) -> ModelRef | None:
    """The weights the spec names at ``field_path`` (one of :data:`WEIGHTS_FIELDS`)."""
    if field_path == "model.init_from":
        return spec.model.ref
    if spec.distill is None:
        return None
    teacher = spec.distill.teacher_ref
    return ModelRef(
        name=teacher.name, version=teacher.version, tenant=teacher.tenant, trial_id=teacher.trial_id
    )


def _pinned(spec: ExperimentSpec, field_path: str, ref: str) -> ExperimentSpec:
    if field_path == "model.init_from":
        return spec.model_copy(update={"model": spec.model.model_copy(update={"init_from": ref})})
    assert spec.distill is not None
    return spec.model_copy(update={"distill": spec.distill.model_copy(update={"teacher": ref})})


def _ref(name: str, tenant: str | None) -> ModelRef:
    try:
        ref = parse_model_ref(f"{tenant}/{name}" if tenant else name)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if ref.trial_id is not None or ref.version is not None:
        raise InvalidRequest(f"{name!r} is not a model name", "a name, without ':VERSION'")
    return ref
