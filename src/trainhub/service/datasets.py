"""Tenant datasets: immutable, content-addressed versions pushed by users, mounted by trials.

A dataset belongs to one tenant and has versions 1, 2, ...; each version is a tar archive in the
artifact store, named by the SHA-256 of its bytes (``tenants/T/datasets/sha256/H.tar``), so the
same content pushed twice is stored once. A push streams: the route hashes the body as it
writes it to a temporary blob; only a body whose hash is the one announced is published (an
atomic rename) and only then does its version row appear, so an interrupted push leaves no
version. Versions count against the tenant's storage quota with its checkpoints and models.

Permissions follow the model registry (service/registry.py): members of the owning tenant
push and remove, its viewers read, its tenant admins share with other tenants, whose members
then read it and mount it; a dataset anyone else names does not exist for them.

A spec's ``data`` list is checked and pinned here at submit (:meth:`DatasetService.pin_data`);
a trial's node fetches the pinned versions with the trial's token (:meth:`trial_datasets`,
:meth:`trial_archive`), checked again, and caches them by hash (adapters/dataset_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from trainhub.core import limits
from trainhub.core.dataset_spec import field_path, mount_errors, split_ref, valid_name
from trainhub.core.errors import (
    FieldError,
    InvalidRequest,
    InvalidSpec,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
)
from trainhub.core.spec import ExperimentSpec
from trainhub.core.tenant_assets import pick_version
from trainhub.service.auth import check_trial_scope, check_write, require_user
from trainhub.service.clock import Clock
from trainhub.service.ports import ArtifactStore, BlobWriter, Principal
from trainhub.service.repository import UnitOfWork
from trainhub.service.tenant_assets import TenantAssets, readable_tenants
from trainhub.service.tracking import StorageQuota


@dataclass(frozen=True)
class DatasetVersion:
    id: int
    dataset: str
    tenant: str
    version: int
    sha256: str
    size_bytes: int
    storage_key: str
    created_at: float
    created_by: str

    @property
    def ref(self) -> str:
        return f"{self.tenant}/{self.dataset}:{self.version}"


@dataclass(frozen=True)
class Dataset:
    id: int
    name: str
    tenant: str
    created_at: float
    created_by: str
    shared_with: tuple[str, ...] = ()
    versions: tuple[DatasetVersion, ...] = field(default=())

    @property
    def latest(self) -> DatasetVersion | None:
        return max(self.versions, key=lambda v: v.version) if self.versions else None


@dataclass(frozen=True)
class PushPlan:
    """A push that passed every check before its body is read."""

    tenant: str
    name: str
    sha256: str
    size_bytes: int
    storage_key: str


@dataclass(frozen=True)
class PushResult:
    version: DatasetVersion
    stored_bytes: int  # 0 when the content was there already


@dataclass(frozen=True)
class MountedVersion:
    """One entry of a trial's ``data`` list, as its node needs it."""

    index: int
    ref: str
    mount: str
    sha256: str
    size_bytes: int


class DatasetStore(Protocol):
    """Datasets, versions and shares in the database (``adapters/db/dataset_store.py``)."""

    def find_datasets(self, name: str, tenant: str | None = None) -> list[Dataset]:
        """Datasets called ``name`` (in ``tenant`` only, if given), with versions and shares."""
        ...

    def list_datasets(self, tenants: Sequence[str] | None, limit: int) -> list[Dataset]:
        """Datasets owned by or shared with ``tenants`` (all when None), by name."""
        ...

    def add_version(
        self,
        tenant: str,
        name: str,
        sha256: str,
        size_bytes: int,
        storage_key: str,
        created_by: str,
        now: float,
    ) -> tuple[DatasetVersion, bool]:
        """The next version of dataset ``name`` (created if new), or its latest when that
        holds the same content already; and whether a version was added."""
        ...

    def delete(self, dataset_id: int, version: int | None) -> list[str]:
        """Remove one version (or all); returns the storage keys no version refers to now."""
        ...

    def set_share(self, dataset_id: int, tenant: str, shared: bool) -> None: ...

    def bytes_of_tenant(self, tenant: str) -> int:
        """Bytes the tenant's datasets store (each distinct content once)."""
        ...


def blob_key(tenant: str, sha256: str) -> str:
    return f"tenants/{tenant}/datasets/sha256/{sha256}.tar"


def _name(name: str) -> str:
    if not valid_name(name):
        raise InvalidRequest(
            f"{name[:80]!r} is not a dataset name",
            "use up to 64 letters, digits, '-', '_' and '.', starting with a letter or digit",
        )
    return name


def _gib(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB"


class DatasetService:
    """Args:
    protected_mounts: paths no dataset may shadow besides the core's list (the node's
        Python environment).
    other_bytes: bytes of a tenant stored outside datasets that share its storage quota
        (checkpoints are read here; the server adds registered models).
    """

    def __init__(
        self,
        uow: UnitOfWork,
        datasets: DatasetStore,
        store: ArtifactStore,
        clock: Clock,
        *,
        protected_mounts: Sequence[str] = (),
        other_bytes: Callable[[str], int] = lambda tenant: 0,
    ) -> None:
        self.uow = uow
        self.datasets = datasets
        self.store = store
        self.clock = clock
        self.protected_mounts = tuple(protected_mounts)
        self.other_bytes = other_bytes
        self.assets: TenantAssets[Dataset] = TenantAssets(
            uow,
            datasets.find_datasets,
            datasets.set_share,
            kind="dataset",
            listing="trainhub data ls",
            share_limit=limits.MAX_DATASET_SHARES,
        )

    # --- reading ---

    def _find(self, name: str, owner: str | None, tenants: Sequence[str] | None) -> Dataset:
        """The one dataset called ``name`` among those ``tenants`` see (their own first)."""
        return self.assets.find(name, owner, tenants)

    @staticmethod
    def _version(dataset: Dataset, version: int | None) -> DatasetVersion:
        return pick_version(dataset.versions, "dataset", dataset.name, version)

    def list_datasets(self, principal: Principal, limit: int = 100) -> list[Dataset]:
        require_user(principal)
        limit = max(1, min(limit, limits.MAX_DATASETS_LISTED))
        found = self.datasets.list_datasets(readable_tenants(principal), limit)
        return [self.assets.hide_shares(principal, d) for d in found]

    def get_dataset(self, principal: Principal, name: str, owner: str | None) -> Dataset:
        require_user(principal)
        found = self._find(_name(name), owner, readable_tenants(principal))
        return self.assets.hide_shares(principal, found)

    def get_version(
        self, principal: Principal, name: str, version: int | None, owner: str | None
    ) -> DatasetVersion:
        return self._version(self.get_dataset(principal, name, owner), version)

    # --- pushing ---

    def _push_tenant(self, principal: Principal, tenant: str | None) -> str:
        require_user(principal)
        if tenant is None:
            writable = [t for t, role in principal.roles.items() if role != "viewer"]
            if not writable:
                raise PermissionDenied(
                    "only members of a tenant push its datasets"
                    + (" (you are a viewer)" if principal.roles else ""),
                    "ask a tenant admin for the member role",
                )
            if len(writable) > 1:
                raise InvalidRequest(
                    "you belong to several tenants; say which one the dataset goes to",
                    "pass --tenant NAME (one of: " + ", ".join(sorted(writable)) + ")",
                )
            tenant = writable[0]
        check_write(principal, tenant, f"tenant {tenant!r}")
        with self.uow() as repo:
            if repo.get_tenant(tenant) is None:
                raise NotFound(f"tenant {tenant!r} does not exist")
        return tenant

    def add_known(
        self, principal: Principal, name: str, sha256: str, tenant: str | None
    ) -> PushResult:
        """A version of ``name`` from content the tenant stored before (no upload); NotFound
        when it has no content with that hash (then upload it)."""
        tenant = self._push_tenant(principal, tenant)
        key = blob_key(tenant, sha256)
        if not self.store.exists(key):
            raise NotFound(f"tenant {tenant!r} has no dataset content {sha256[:12]}", "upload it")
        version, _ = self.datasets.add_version(
            tenant, _name(name), sha256, self.store.size(key), key, principal.username, self.clock()
        )
        return PushResult(version, 0)

    def begin_push(
        self, principal: Principal, name: str, sha256: str, size_bytes: int, tenant: str | None
    ) -> PushPlan:
        """Check a push before its body is read: who, which tenant, the quota."""
        tenant = self._push_tenant(principal, tenant)
        self._check_room(tenant, size_bytes)
        return PushPlan(tenant, _name(name), sha256, size_bytes, blob_key(tenant, sha256))

    def _check_room(self, tenant_name: str, size_bytes: int) -> None:
        with self.uow() as repo:
            tenant = repo.get_tenant(tenant_name)
            assert tenant is not None
            checkpoints = repo.checkpoint_bytes_by_tenant().get(tenant_name, 0)
        quota = StorageQuota.of(tenant).max_storage_bytes
        used = (
            checkpoints + self.other_bytes(tenant_name) + self.datasets.bytes_of_tenant(tenant_name)
        )
        if used + size_bytes > quota:
            raise QuotaExceeded(
                f"a dataset of {_gib(size_bytes)} does not fit in tenant {tenant_name!r}'s "
                f"storage quota of {_gib(quota)} ({_gib(max(0, quota - used))} left; datasets "
                "count with checkpoints and models)",
                "remove old versions (trainhub data rm) or ask an admin to raise the quota",
            )

    def open_writer(self, plan: PushPlan) -> BlobWriter:
        """Where the body goes: a temporary blob, published under the hash's key on commit."""
        return self.store.open_writer(plan.storage_key)

    def finish_push(
        self, principal: Principal, plan: PushPlan, writer: BlobWriter, sha256: str
    ) -> PushResult:
        """Publish a fully received body whose hash is ``sha256`` and add its version; the
        writer is aborted when anything is refused."""
        try:
            if sha256 != plan.sha256:
                raise InvalidRequest(
                    f"the body's SHA-256 is {sha256}, not the {plan.sha256} announced",
                    "the upload was corrupted: push again",
                )
            if writer.size != plan.size_bytes:
                raise InvalidRequest(
                    f"received {writer.size} bytes of the {plan.size_bytes} announced",
                    "push again",
                )
            self._check_room(plan.tenant, plan.size_bytes)
            size = writer.commit()
        except BaseException:
            writer.abort()
            raise
        version, _ = self.datasets.add_version(
            plan.tenant,
            plan.name,
            plan.sha256,
            size,
            plan.storage_key,
            principal.username,
            self.clock(),
        )
        return PushResult(version, size)

    # --- removing, sharing ---

    def remove(
        self, principal: Principal, name: str, version: int | None, owner: str | None
    ) -> list[str]:
        """Remove one version (or the whole dataset); members of its tenant. Content no
        version refers to any more is deleted. Returns the refs removed."""
        dataset = self.get_dataset(principal, name, owner)
        check_write(principal, dataset.tenant, f"dataset {name}")
        gone = [v for v in dataset.versions if version is None or v.version == version]
        if version is not None and not gone:
            self._version(dataset, version)  # raises NotFound with the versions it has
        for key in self.datasets.delete(dataset.id, version):
            self.store.delete(key)
        return [v.ref for v in gone]

    def share(
        self, principal: Principal, name: str, tenant: str, shared: bool, owner: str | None
    ) -> Dataset:
        """Share dataset ``name`` with ``tenant`` (or stop): admins of its tenant only."""
        dataset = self.get_dataset(principal, name, owner)
        self.assets.share(principal, dataset, name, tenant, shared)
        return self.get_dataset(principal, name, dataset.tenant)

    # --- a spec's data list ---

    def pin_data(self, principal: Principal, tenant: str, spec: ExperimentSpec) -> ExperimentSpec:
        """Check a submission's ``data`` list and pin each entry (``TENANT/NAME`` and its
        version); 422 naming the field for a bad mount path, a dataset ``tenant`` cannot see
        (answered as one that does not exist) or a version that does not exist."""
        if not spec.data:
            return spec
        errors = mount_errors([d.mount for d in spec.data], self.protected_mounts)
        pinned = []
        for index, item in enumerate(spec.data):
            owner, name = split_ref(item.name)
            try:
                dataset = self._find(name, owner, [tenant])
            except (NotFound, InvalidRequest) as exc:
                message = exc.message
                if isinstance(exc, NotFound):
                    message = f"dataset {item.name} does not exist in tenant {tenant!r}"
                hint = exc.hint or "see `trainhub data ls`"
                errors.append(FieldError(field_path(index, "name"), message, hint))
                continue
            try:
                version = self._version(dataset, item.version)
            except NotFound as exc:
                errors.append(FieldError(field_path(index, "version"), exc.message, exc.hint))
                continue
            pinned.append(
                item.model_copy(
                    update={"name": f"{dataset.tenant}/{name}", "version": version.version}
                )
            )
        if errors:
            raise InvalidSpec(errors)
        return spec.model_copy(update={"data": pinned})

    def _pinned(self, tenant: str, spec: ExperimentSpec) -> list[tuple[int, str, DatasetVersion]]:
        out = []
        for index, item in enumerate(spec.data):
            owner, name = split_ref(item.name)
            try:
                version = self._version(self._find(name, owner, [tenant]), item.version)
            except (NotFound, InvalidRequest):
                raise NotFound(
                    f"dataset {item.name}:{item.version} ({field_path(index, 'name')}) is gone "
                    f"or no longer shared with tenant {tenant!r}"
                ) from None
            out.append((index, item.mount, version))
        return out

    def _trial_spec(self, principal: Principal, trial_id: int) -> tuple[str, ExperimentSpec]:
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_trial_scope(principal, trial_id, trial.tenant, write=False)
            spec = ExperimentSpec.model_validate(repo.experiment_of(trial_id).spec)
        return trial.tenant, spec

    def trial_datasets(self, principal: Principal, trial_id: int) -> list[MountedVersion]:
        """The datasets trial ``trial_id`` mounts (for its node, with its token), checked
        again: an unshare or a removal stops later attempts."""
        tenant, spec = self._trial_spec(principal, trial_id)
        return [
            MountedVersion(index, v.ref, mount, v.sha256, v.size_bytes)
            for index, mount, v in self._pinned(tenant, spec)
        ]

    def trial_archive(
        self, principal: Principal, trial_id: int, index: int
    ) -> tuple[DatasetVersion, Iterator[bytes]]:
        """The archive of entry ``index`` of the trial's ``data`` list, in chunks."""
        tenant, spec = self._trial_spec(principal, trial_id)
        found = [v for i, _, v in self._pinned(tenant, spec) if i == index]
        if not found:
            raise NotFound(f"trial {trial_id} mounts no dataset at data[{index}]")
        return found[0], self.store.iter_chunks(found[0].storage_key)


def no_datasets(principal: Principal, tenant: str, spec: ExperimentSpec) -> ExperimentSpec:
    """What a server without a dataset store answers to a spec that names datasets."""
    if spec.data:
        raise InvalidSpec(
            [
                FieldError(field_path(i, "name"), "this server keeps no datasets", "ask an admin")
                for i in range(len(spec.data))
            ]
        )
    return spec
