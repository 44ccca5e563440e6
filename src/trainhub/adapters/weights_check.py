"""Whether a checkpoint's weights load into the architecture a model version declares.

The registry asks before it keeps a version (service/registry.py, ``WeightsCheck``): a
version whose weights do not fit its architecture would fail at export and in every training
started from it. torch and the model zoo are imported here, on first use.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import Any

SHOWN = 6  # tensors named per kind; the count says how many more


def _names(kind: str, names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f"{kind} {', '.join(names[:SHOWN])}{more}"


class TorchWeightsCheck:
    """:class:`trainhub.service.registry.WeightsCheck` with torch and ``trainhub.models``."""

    def mismatch(self, arch: Mapping[str, Any], weights: bytes) -> str | None:
        import torch

        from trainhub.models import create
        from trainhub.runtime.init_model import extract_state_dict

        try:
            model = create(str(arch["zoo"]), **dict(arch.get("args") or {}))
        except (TypeError, ValueError) as exc:
            return f"the architecture does not build ({exc})"
        try:
            loaded = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
            state = extract_state_dict(loaded)
        except (ValueError, RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:
            return f"the checkpoint holds no readable weights ({exc})"
        expected = model.state_dict()
        missing = [k for k in expected if k not in state]
        unexpected = [k for k in state if k not in expected]
        misshapen = [
            f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
            for k, v in expected.items()
            if k in state and tuple(state[k].shape) != tuple(v.shape)
        ]
        parts = [
            _names(kind, names)
            for kind, names in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("of another shape", misshapen),
            )
            if names
        ]
        return "; ".join(parts) or None
