"""The pure rules of per-experiment Python environments (docs/environments.md, ADR 0026).

An experiment asks for packages with ``environment.requirements`` (a file of its code) or
``environment.packages``. The platform resolves the request once to a lock (``uv pip compile``
with the base environment's versions as constraints), and installs the lock into a venv
layered over the base: torch, the trainhub runtime and everything else the base holds are
not installed again. The venv is content-addressed by :func:`environment_key`: the hash of the
lock, the Python version and the base environment's identity.

What is refused, at submit (422 naming the field): a line that is not a PEP 508 requirement, a
pip option (``-r``, ``-e``, ``--index-url``...), and a version of torch or trainhub other than
the base's: the platform's torch is the one its GPUs, drivers and runtime are tested with. A
request for ``torch`` with no version, or with one the base's version satisfies, is accepted
and means the base's torch (it is a constraint of every lock).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from trainhub.core import limits
from trainhub.core.errors import FieldError

# packages that only the platform installs: a request may name them only at the base's version
PLATFORM_PACKAGES = frozenset({"torch", "trainhub"})
MAX_REQUIREMENTS = limits.MAX_REQUIREMENTS
MAX_REQUIREMENT_CHARS = limits.MAX_REQUIREMENT_CHARS
MAX_REQUIREMENTS_FILE_BYTES = limits.MAX_REQUIREMENTS_FILE_BYTES
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class EnvironmentState(StrEnum):
    """The life of one cached environment (a row of the ``environments`` table)."""

    BUILDING = "building"  # being resolved and installed on a node; trials wait, no slot held
    READY = "ready"  # installed, read-only; every trial with the same request uses it
    FAILED = "failed"  # did not resolve or install; the trials that waited failed once


def canonical_name(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Foo_Bar`` is ``foo-bar``)."""
    return str(canonicalize_name(name))


def requirement_lines(text: str) -> list[str]:
    """The requirement lines of a requirements file: comments, blanks and trailing comments out."""
    lines = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line:
            lines.append(line)
    return lines


def check_requirements(
    lines: Sequence[str], field: str, base_versions: Mapping[str, str]
) -> list[FieldError]:
    """What is wrong with a request, one :class:`FieldError` per problem (empty: accepted).

    ``base_versions`` maps canonical names to the base environment's versions (for torch and
    trainhub at least).
    """
    errors: list[FieldError] = []
    if len(lines) > MAX_REQUIREMENTS:
        return [
            FieldError(
                field,
                f"{len(lines)} requirements; the limit is {MAX_REQUIREMENTS}",
                "keep the packages the script imports; their dependencies come by themselves",
            )
        ]
    for number, line in enumerate(lines, start=1):
        where = f"{field}[{number - 1}]" if field.endswith("packages") else field
        label = line[:80]
        if len(line) > MAX_REQUIREMENT_CHARS:
            errors.append(
                FieldError(where, f"line {number} is longer than {MAX_REQUIREMENT_CHARS}")
            )
            continue
        if line.startswith("-"):
            errors.append(
                FieldError(
                    where,
                    f"{label!r}: pip options are not accepted in a request",
                    "list packages only (name and version), one per line; the platform "
                    "chooses the index",
                )
            )
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            errors.append(
                FieldError(
                    where,
                    f"{label!r} is not a requirement: {exc}",
                    "write a package as pip does: name, optional extras and version, "
                    "e.g. einops==0.8.1",
                )
            )
            continue
        name = canonical_name(requirement.name)
        if name in PLATFORM_PACKAGES:
            problem = _platform_request_problem(name, requirement, base_versions)
            if problem:
                errors.append(FieldError(where, problem, _platform_hint(name, base_versions)))
    return errors


def _platform_request_problem(
    name: str, requirement: Requirement, base_versions: Mapping[str, str]
) -> str:
    """Why a request for torch or trainhub is refused ('' when the base's version fits)."""
    base = base_versions.get(name)
    if requirement.url:
        return f"{name} from a URL: the platform provides {name} {base or ''}".rstrip()
    if not requirement.specifier:
        return ""
    if base is None:
        return f"{name} is provided by the platform and cannot be installed by a request"
    if requirement.specifier.contains(base, prereleases=True):
        return ""
    return (
        f"asks for {name}{requirement.specifier}, but the platform's {name} is {base} and "
        "cannot be replaced"
    )


def _platform_hint(name: str, base_versions: Mapping[str, str]) -> str:
    base = base_versions.get(name)
    pinned = f" or pin {name}=={base}" if base else ""
    return f"remove the {name} line (the base's {name} is used){pinned}"


@dataclass(frozen=True, slots=True)
class BaseIdentity:
    """The environment every trial environment is layered over (the node's Python)."""

    python_version: str  # e.g. "3.11.9"
    digest: str  # hash of the base's installed distributions and their versions

    @staticmethod
    def of(python_version: str, distributions: Iterable[tuple[str, str]]) -> BaseIdentity:
        lines = sorted(f"{canonical_name(n)}=={v}" for n, v in distributions)
        return BaseIdentity(python_version, _sha256("\n".join(lines)))


def request_key(lines: Sequence[str], base: BaseIdentity) -> str:
    """The identity of a request (before resolution): same lines, same base, same key."""
    normalized = "\n".join(sorted({" ".join(line.split()) for line in lines}))
    return _sha256(f"request\n{base.python_version}\n{base.digest}\n{normalized}")


def environment_key(lock: str, base: BaseIdentity) -> str:
    """The content address of an environment: its lock, Python version and base."""
    pins = "\n".join(sorted(line.strip() for line in requirement_lines(lock)))
    return _sha256(f"environment\n{base.python_version}\n{base.digest}\n{pins}")


def layered_packages(lock: str, base_versions: Mapping[str, str]) -> list[str]:
    """The pins of a lock that the venv installs: those the base does not already hold."""
    kept = []
    for line in requirement_lines(lock):
        match = _NAME.match(line)
        if match is None:
            continue
        name = canonical_name(match.group(1))
        pinned = line[match.end() :].strip()
        version = pinned[2:].strip() if pinned.startswith("==") else None
        have = base_versions.get(name)
        if version is not None and have is not None:
            # the base's torch 2.13.0+cpu is the index's 2.13.0: the same release
            wanted = version.split(";")[0].strip()
            if wanted in (have, have.split("+", 1)[0]):
                continue
        kept.append(line)
    return kept


def short_key(key: str) -> str:
    """How a key is shown: its first 12 hex digits (accepted back as a prefix)."""
    return key[:12]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
