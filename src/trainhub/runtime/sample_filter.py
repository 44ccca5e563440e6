"""Leave out or relabel training samples named by ``trainhub clone --drop-flagged/--relabel``.

The clone's trial gets ``TRAINHUB_SAMPLE_FILTER`` (JSON ``{"drop": [ids], "relabel": {"id":
label}}``). :meth:`Context.prepare_data_loader` and ``trainhub.data.make_loader`` apply it to
shuffled (training) datasets that carry sample ids (``trainhub.data``'s in-memory datasets);
:func:`apply_sample_filter` applies it to any such dataset explicitly. Datasets without ids
are left as they are, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch.utils.data import Dataset

from trainhub.runtime import protocol

logger = logging.getLogger("trainhub.runtime")

T = TypeVar("T")


@dataclass(frozen=True)
class SampleFilter:
    drop: frozenset[int] = frozenset()
    relabel: Mapping[int, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.drop or self.relabel)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SampleFilter:
        text = (os.environ if environ is None else environ).get(protocol.ENV_SAMPLE_FILTER)
        if not text:
            return cls()
        try:
            data: Any = json.loads(text)
            drop = frozenset(int(i) for i in data.get("drop", []))
            relabel = {int(k): int(v) for k, v in data.get("relabel", {}).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{protocol.ENV_SAMPLE_FILTER} must be JSON like "
                f'{{"drop": [3, 17], "relabel": {{"5": 1}}}}: {exc}'
            ) from None
        return cls(drop, relabel)


def apply_sample_filter(
    dataset: Dataset[T], sample_filter: SampleFilter | None = None
) -> Dataset[T]:
    """``dataset`` without the dropped samples and with the relabeled labels replaced.

    Args:
        dataset: One with sample ids and a ``filtered(drop, relabel)`` method (the in-memory
            datasets of ``trainhub.data`` and their ``with_ids()``).
        sample_filter: Default: the trial's ``TRAINHUB_SAMPLE_FILTER``.
    """
    chosen = SampleFilter.from_env() if sample_filter is None else sample_filter
    if not chosen:
        return dataset
    filtered = getattr(dataset, "filtered", None)
    if filtered is None:
        logger.warning(
            "trainhub: %s asks to drop %d and relabel %d samples, but the dataset (%s) has no "
            "sample ids; use trainhub.data's datasets or filter it yourself",
            protocol.ENV_SAMPLE_FILTER,
            len(chosen.drop),
            len(chosen.relabel),
            type(dataset).__name__,
        )
        return dataset
    result: Dataset[T] = filtered(sorted(chosen.drop), dict(chosen.relabel))
    logger.warning(
        "trainhub: training without %d of %d samples and with %d relabeled (%s)",
        len(dataset) - len(result),  # type: ignore[arg-type]
        len(dataset),  # type: ignore[arg-type]
        len(chosen.relabel),
        protocol.ENV_SAMPLE_FILTER,
    )
    return result
