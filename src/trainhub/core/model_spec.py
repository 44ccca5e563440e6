"""The spec's ``model:`` section: start from a registered model or a trial, and transform it.

    model:
      init_from: digits-lenet:2        # NAME, NAME:VERSION, TENANT/NAME[:VERSION] or trial:ID
      freeze: ["features.*"]           # parameters (glob on their names) kept fixed
      reset: ["classifier.4.*"]        # parameters re-initialised, never loaded
      grow: {wider: {fc1: 2.0}, deeper: [conv2]}   # Net2Net, applied after loading
      arch: {zoo: lenet5, args: {num_classes: 10}, input: [1, 28, 28]}

``arch`` says what the script builds (a zoo name and its arguments); the registry records it
with every model version registered from the trial (docs/adr/0015-model-registry.md).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainhub.core import limits
from trainhub.core.errors import FieldError

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(MODEL_NAME_PATTERN)
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_Pattern = Annotated[str, Field(min_length=1, max_length=limits.MAX_MODEL_PATTERN_CHARS)]
_Layer = Annotated[str, Field(min_length=1, max_length=limits.MAX_MODEL_PATTERN_CHARS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True)
class ModelRef:
    """A parsed ``init_from``: a registered model (``name``, optional ``tenant`` and
    ``version``) or a trial's latest checkpoint (``trial_id``)."""

    name: str | None = None
    version: int | None = None
    tenant: str | None = None
    trial_id: int | None = None

    def __str__(self) -> str:
        if self.trial_id is not None:
            return f"trial:{self.trial_id}"
        head = f"{self.tenant}/{self.name}" if self.tenant else str(self.name)
        return f"{head}:{self.version}" if self.version is not None else head


def parse_model_ref(text: str) -> ModelRef:
    """``NAME``, ``NAME:VERSION``, ``TENANT/NAME[:VERSION]`` or ``trial:ID``.

    Raises:
        ValueError: with what the forms are.
    """
    forms = "use NAME, NAME:VERSION, TENANT/NAME:VERSION or trial:ID"
    text = text.strip()
    if text.startswith("trial:"):
        number = text.removeprefix("trial:")
        if not number.isdigit() or len(number) > 18 or int(number) < 1:
            raise ValueError(f"{text!r}: a trial id is a positive integer ({forms})")
        return ModelRef(trial_id=int(number))
    head, _, version_text = text.partition(":")
    version = None
    if version_text:
        if not version_text.isdigit() or len(version_text) > 9 or int(version_text) < 1:
            raise ValueError(f"{text!r}: a version is a positive integer ({forms})")
        version = int(version_text)
    tenant, _, name = head.rpartition("/")
    if not _NAME.match(name):
        raise ValueError(
            f"{text!r}: a model name is 1-64 letters, digits, '_', '.' or '-' ({forms})"
        )
    if tenant and not _TENANT.match(tenant):
        raise ValueError(f"{text!r}: {tenant!r} is not a tenant name ({forms})")
    return ModelRef(name=name, version=version, tenant=tenant or None)


# the zoo of trainhub.models (tests/models/test_zoo_names.py keeps both the same); core names it
# without importing torch. Checked at submit and registration, not when a stored spec is read.
ZOO_MODELS = ("lenet5", "mlp", "resnet18", "resnet20", "transformer")


def zoo_error(zoo: object, path: str) -> FieldError | None:
    """A FieldError at ``path`` when ``zoo`` names no model of the zoo (as ``models.create``
    reads names: case, '-' and '_' ignored); None when it does."""
    key = str(zoo).lower().replace("-", "").replace("_", "")
    if key in ZOO_MODELS:
        return None
    close = difflib.get_close_matches(key, ZOO_MODELS, n=1)
    hint = (f"did you mean {close[0]!r}? " if close else "") + "the zoo: " + ", ".join(ZOO_MODELS)
    return FieldError(path, f"unknown zoo model {str(zoo)[:64]!r}", hint)


class ArchSpec(_Strict):
    """What builds the model: a zoo name and its arguments (``trainhub.models.create``)."""

    zoo: str = Field(..., pattern=r"^[A-Za-z0-9_-]{1,64}$", description="e.g. lenet5, resnet20.")
    args: dict[Annotated[str, Field(max_length=64)], Any] = Field(
        default_factory=dict,
        max_length=limits.MAX_MODEL_ARCH_ARGS,
        description="Keyword arguments of the zoo factory, e.g. {num_classes: 10}.",
    )
    input: list[Annotated[int, Field(ge=1, le=1_000_000)]] | None = Field(
        None, min_length=1, max_length=4, description="Shape of one input, e.g. [1, 28, 28]."
    )
    task: str = Field("image-classification", max_length=64)


class GrowSpec(_Strict):
    """Net2Net growth applied after the weights are loaded (function-preserving)."""

    wider: dict[_Layer, Annotated[float, Field(gt=1.0, le=limits.MAX_GROW_FACTOR)]] = Field(
        default_factory=dict,
        max_length=limits.MAX_GROW_LAYERS,
        description="Layer name -> width factor (> 1), e.g. {fc1: 2.0}.",
    )
    deeper: list[_Layer] = Field(
        default_factory=list,
        max_length=limits.MAX_GROW_LAYERS,
        description="Layers after which an identity-initialised layer is inserted.",
    )


class ModelSpec(_Strict):
    """Where the script's model starts, and what is frozen, reset or grown."""

    init_from: str | None = Field(
        None,
        max_length=160,
        description="A registered model (NAME, NAME:VERSION, TENANT/NAME:VERSION) or "
        "trial:ID (its latest checkpoint). Resolved and checked at submit; a name without "
        "a version is pinned to its latest version then.",
    )
    freeze: list[_Pattern] = Field(
        default_factory=list,
        max_length=limits.MAX_MODEL_PATTERNS,
        description="Glob patterns of parameter names kept fixed, e.g. 'features.*'.",
    )
    reset: list[_Pattern] = Field(
        default_factory=list,
        max_length=limits.MAX_MODEL_PATTERNS,
        description="Glob patterns of parameter names not loaded (fresh initialisation), "
        "e.g. the classifier head when the number of classes changes.",
    )
    grow: GrowSpec | None = None
    arch: ArchSpec | None = Field(
        None, description="What the script builds; recorded with registered versions."
    )

    @field_validator("init_from")
    @classmethod
    def _ref_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_model_ref(value)
        return value

    @property
    def ref(self) -> ModelRef | None:
        return parse_model_ref(self.init_from) if self.init_from else None
