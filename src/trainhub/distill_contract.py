"""The ``distill`` section of the experiment spec, written once for both sides.

A leaf module (pydantic and the pure :mod:`trainhub.core.limits`; no torch) shared by the control
plane, which validates a submitted spec with :class:`DistillSpec`, and the runtime, which parses
the JSON the control plane put in ``TRAINHUB_DISTILL`` with the same class.

```yaml
distill:
  teacher: mnist-resnet:3        # NAME[:VERSION] from the model registry, or trial:ID
  temperature: 4.0               # softens both distributions (Hinton et al. 2015)
  alpha: 0.9                     # weight of the soft-target loss; 1 - alpha for the labels
  hints:                         # FitNet (Romero et al. 2015): student layer -> teacher layer
    - {student: features.3, teacher: blocks.4.conv1}
  hint_weight: 1.0
```
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainhub.core import limits

ENV_DISTILL = "TRAINHUB_DISTILL"  # the same name as trainhub.runtime.protocol's
MODEL_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
_TEACHER = re.compile(
    rf"^(?:trial:(?P<trial>[1-9][0-9]{{0,17}})|(?:(?P<tenant>{MODEL_NAME})/)?(?P<name>{MODEL_NAME})"
    r"(?::(?P<version>[1-9][0-9]{0,8}|latest))?)$"
)
_LAYER = r"^[A-Za-z0-9_][A-Za-z0-9_.]*$"


@dataclass(frozen=True)
class TeacherRef:
    """Where the teacher's weights come from: a registered model version or a trial."""

    kind: Literal["model", "trial"]
    name: str | None = None  # kind == "model"
    tenant: str | None = None  # a model shared by another tenant: TENANT/NAME
    version: int | None = None  # None: the latest version
    trial_id: int | None = None  # kind == "trial"

    def __str__(self) -> str:
        if self.kind == "trial":
            return f"trial:{self.trial_id}"
        head = f"{self.tenant}/{self.name}" if self.tenant else str(self.name)
        return f"{head}:{self.version if self.version is not None else 'latest'}"


def parse_teacher(text: str) -> TeacherRef:
    """``NAME``, ``NAME:VERSION``, ``NAME:latest``, ``TENANT/NAME[:VERSION]`` or ``trial:ID``.

    Raises:
        ValueError: the text is none of these.
    """
    match = _TEACHER.match(text)
    if match is None:
        raise ValueError(
            f"{text[:80]!r} is not a teacher reference: use NAME, NAME:VERSION, "
            "TENANT/NAME:VERSION (a registered model, e.g. mnist-resnet:3) or trial:ID (the "
            "latest checkpoint of a trial)"
        )
    if match["trial"]:
        return TeacherRef("trial", trial_id=int(match["trial"]))
    version = match["version"]
    return TeacherRef(
        "model",
        name=match["name"],
        tenant=match["tenant"],
        version=None if version in (None, "latest") else int(version),
    )


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_LayerName = Annotated[
    str, Field(min_length=1, max_length=limits.MAX_LAYER_NAME_CHARS, pattern=_LAYER)
]


class HintSpec(_Section):
    """One FitNet hint: the student's layer learns (through an adapter) the teacher's layer."""

    student: _LayerName = Field(..., description="Module path in the student, e.g. features.3.")
    teacher: _LayerName = Field(..., description="Module path in the teacher, e.g. blocks.4.")


class DistillSpec(_Section):
    """Train the script's model as a student of a teacher (soft targets, optional hints)."""

    teacher: str = Field(
        ...,
        max_length=200,
        description="NAME[:VERSION] of a registered model, or trial:ID for a trial's latest "
        "checkpoint.",
    )
    temperature: Annotated[
        float,
        Field(gt=0, le=limits.MAX_DISTILL_TEMPERATURE, description="Softmax temperature T."),
    ] = 4.0
    alpha: Annotated[
        float,
        Field(ge=0, le=1, description="Weight of the soft-target loss; 1 - alpha weighs labels."),
    ] = 0.9
    hints: list[HintSpec] = Field(
        default_factory=list,
        max_length=limits.MAX_DISTILL_HINTS,
        description="FitNet hints: pairs of student and teacher layers.",
    )
    hint_weight: Annotated[
        float, Field(ge=0, le=1000, description="Weight of the summed hint losses.")
    ] = 1.0

    @field_validator("teacher")
    @classmethod
    def _reference(cls, value: str) -> str:
        parse_teacher(value)
        return value

    @property
    def teacher_ref(self) -> TeacherRef:
        return parse_teacher(self.teacher)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> DistillSpec:
        """Validate the parsed JSON/YAML of the section.

        Raises:
            ValueError: ``distill.<field path>: <what is wrong>`` for the first problem.
        """
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            first = exc.errors()[0]
            path = ".".join(str(p) for p in ("distill", *first["loc"]))
            raise ValueError(f"{path}: {first['msg'].removeprefix('Value error, ')}") from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistillSpec | None:
        """The section the control plane put in ``TRAINHUB_DISTILL``; None if unset."""
        env = os.environ if environ is None else environ
        text = env.get(ENV_DISTILL, "")
        if not text.strip():
            return None
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{ENV_DISTILL} must hold a JSON object")
        return cls.from_mapping(data)
