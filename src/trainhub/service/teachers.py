"""Where a spec's ``distill.teacher`` comes from: checked at submit, served to the student.

``trial:ID`` names the latest checkpoint of a trial of the submitting tenant. A registered
model (``NAME[:VERSION]``) is the model registry's to check and serve (docs/models.md).
"""

from __future__ import annotations

from trainhub.core.distill_spec import parse_teacher
from trainhub.core.errors import FieldError, InvalidSpec
from trainhub.core.spec import ExperimentSpec
from trainhub.service.records import Checkpoint
from trainhub.service.repository import Repository, UnitOfWork


class TeacherMissing(Exception):
    """The teacher a spec names cannot be had; ``args[0]`` says why, ``hint`` what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def teacher_checkpoint(repo: Repository, teacher: str, tenant: str) -> Checkpoint | None:
    """The checkpoint ``teacher`` (a ``distill.teacher``) names for ``tenant``; None for a
    registered model (the registry's).

    Raises:
        TeacherMissing: the trial does not exist in ``tenant`` or has no checkpoint.
    """
    ref = parse_teacher(teacher)
    if ref.kind != "trial" or ref.trial_id is None:
        return None
    trial = repo.get_trial(ref.trial_id)
    if trial is None or trial.tenant != tenant:
        raise TeacherMissing(
            f"teacher trial {ref.trial_id} does not exist in this tenant",
            "a teacher of another tenant must be registered as a model and shared",
        )
    checkpoints = repo.list_checkpoints(ref.trial_id)
    if not checkpoints:
        raise TeacherMissing(
            f"teacher trial {ref.trial_id} has no checkpoint yet", "pick a trial that saved one"
        )
    return max(checkpoints, key=lambda c: (c.step, c.id))


def check_teacher(uow: UnitOfWork, tenant: str, spec: ExperimentSpec) -> None:
    """Refuse a submission whose ``distill.teacher`` trial cannot be had, at its field."""
    if spec.distill is None:
        return
    with uow() as repo:
        try:
            teacher_checkpoint(repo, spec.distill.teacher, tenant)
        except TeacherMissing as exc:
            raise InvalidSpec([FieldError("distill.teacher", exc.message, exc.hint)]) from None
