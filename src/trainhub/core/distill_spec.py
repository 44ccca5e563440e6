"""The ``distill`` section of the experiment spec, as the core sees it.

Defined once in the leaf module :mod:`trainhub.distill_contract`, which the runtime parses
``TRAINHUB_DISTILL`` with too; re-exported here so the core's spec reads it from its own package.
"""

from __future__ import annotations

from trainhub.distill_contract import DistillSpec, HintSpec, TeacherRef, parse_teacher

__all__ = ["DistillSpec", "HintSpec", "TeacherRef", "parse_teacher"]
