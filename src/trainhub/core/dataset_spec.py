"""The spec's ``data`` section and the rules of a dataset mount (pure).

A trial names the tenant datasets it reads::

    data:
      - {name: imagenet-mini, version: 3, mount: /data/imagenet}
      - {name: vision/labels, mount: /data/labels}      # another tenant's, shared; latest

At submit the service resolves each name to one version the tenant may read and pins it
(``name`` becomes ``TENANT/NAME``, ``version`` the number); :func:`mount_errors` checks the
mount paths here, with the field path of each problem (``data[1].mount``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from trainhub.core import limits
from trainhub.core.errors import FieldError

DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(DATASET_NAME_PATTERN)
DATASET_REF_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,63}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"

# Paths a dataset may neither be mounted at, inside, nor above: the system the sandbox binds
# (adapters/sandbox.py SYSTEM_DIRS), the folders it makes itself (/tmp, /dev, /proc, /sys) and
# the trial's own folders (/trial: code, scratch, checkpoints, home, spool). The node's Python
# environment is added by the service (it knows where it lives).
PROTECTED_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/tmp",
    "/dev",
    "/proc",
    "/sys",
    "/trial",
    "/run",
    "/var",
    "/boot",
    "/root",
)


class DataMount(BaseModel):
    """One dataset a trial reads, read-only, at ``mount``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        ...,
        pattern=DATASET_REF_PATTERN,
        description="A dataset of the tenant (NAME) or one shared with it (TENANT/NAME); "
        "`trainhub data ls` lists them.",
    )
    version: Annotated[int, Field(ge=1, le=limits.INT64_MAX)] | None = Field(
        None, description="Default: the latest version at submit (then pinned)."
    )
    mount: str = Field(
        ...,
        min_length=1,
        max_length=limits.MAX_MOUNT_PATH_CHARS,
        description="Absolute path the trial reads it at, e.g. /data/imagenet; not under "
        "/usr, /etc, /tmp, /trial, ... nor the Python environment.",
    )


def field_path(index: int, name: str) -> str:
    return f"data[{index}].{name}"


def bracket_paths(errors: Iterable[FieldError]) -> list[FieldError]:
    """``data.1.mount`` (pydantic's path) written as ``data[1].mount``."""
    out = []
    for e in errors:
        match = re.match(r"^data\.(\d+)(\.|$)", e.path)
        path = f"data[{match.group(1)}]{e.path[match.end(1) :]}" if match else e.path
        out.append(FieldError(path, e.message, e.hint))
    return out


def split_ref(ref: str) -> tuple[str | None, str]:
    """``TENANT/NAME`` or ``NAME`` -> (tenant or None, name)."""
    tenant, _, name = ref.rpartition("/")
    return (tenant or None), name


def valid_name(name: str) -> bool:
    return bool(_NAME.match(name)) and len(name) <= limits.MAX_DATASET_NAME_CHARS


def _within(path: str, parent: str) -> bool:
    """``path`` is ``parent`` or lies inside it."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def mount_error(mount: str, protected: Iterable[str]) -> str | None:
    """Why ``mount`` cannot hold a dataset, or None."""
    if "\x00" in mount:
        return "the path contains a NUL byte"
    if not mount.startswith("/"):
        return f"{mount!r} is relative; a mount path is absolute, e.g. /data/{mount.strip('./')}"
    parts = mount.split("/")
    if any(p in (".", "..") for p in parts):
        return f"{mount!r} has '.' or '..' components; write the path plainly"
    normal = posixpath.normpath(mount)
    if normal == "/":
        return "a dataset cannot be mounted at '/' (it would hide the whole system)"
    for path in protected:
        if _within(normal, path):
            return f"{mount!r} lies in {path}, which the sandbox needs (system, environment or "
            "the trial's own folders)"
        if _within(path, normal):
            return f"{mount!r} would hide {path}, which the sandbox needs"
    return None


def mount_errors(mounts: Sequence[str], protected: Iterable[str] = ()) -> list[FieldError]:
    """Every problem of the mount paths of a spec's ``data`` list, at ``data[i].mount``: a
    relative path, one that shadows :data:`PROTECTED_PATHS` or ``protected`` (the Python
    environment), or one that repeats (or lies inside) an earlier mount."""
    guarded = list(dict.fromkeys([*PROTECTED_PATHS, *protected]))
    errors: list[FieldError] = []
    seen: list[tuple[int, str]] = []
    hint = "mount it under a folder of its own, e.g. /data/NAME"
    for index, mount in enumerate(mounts):
        where = field_path(index, "mount")
        problem = mount_error(mount, guarded)
        if problem:
            errors.append(FieldError(where, problem, hint))
            continue
        normal = posixpath.normpath(mount)
        clash = next(
            (i for i, other in seen if _within(normal, other) or _within(other, normal)), None
        )
        if clash is not None:
            other = mounts[clash]
            said = "repeats" if posixpath.normpath(other) == normal else "overlaps"
            errors.append(
                FieldError(
                    where,
                    f"{mount!r} {said} {field_path(clash, 'mount')} ({other!r})",
                    "give every dataset its own folder",
                )
            )
            continue
        seen.append((index, normal))
    return errors
