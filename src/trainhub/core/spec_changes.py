"""``PATH=VALUE`` changes to a spec (``trainhub clone --set``, the dashboard's clone form).

``lr=0.01`` names a hyperparameter, ``searcher.max_trials=64`` a spec field (the service
decides which, in ``apply_change``); values are YAML: numbers, strings, ``{type: log, ...}``.
"""

from __future__ import annotations

from typing import Any

import yaml

from trainhub.core.errors import InvalidRequest
from trainhub.core.limits import MAX_SPEC_BYTES, MAX_SPEC_CHANGES


def parse_changes(pairs: list[str]) -> dict[str, Any]:
    """{"lr": 0.01, ...} from ``["lr=0.01", ...]``; a value that is not YAML stays text."""
    if len(pairs) > MAX_SPEC_CHANGES:
        raise InvalidRequest(
            f"{len(pairs)} changes; the limit is {MAX_SPEC_CHANGES}", "submit a new spec instead"
        )
    changes: dict[str, Any] = {}
    for pair in pairs:
        path, sep, raw = pair.partition("=")
        if not sep or not path.strip():
            raise InvalidRequest(
                f"{pair[:100]!r} is not PATH=VALUE", "e.g. lr=0.01 or searcher.max_trials=64"
            )
        if len(pair) > MAX_SPEC_BYTES:
            raise InvalidRequest(f"the change of {path.strip()[:100]!r} is over 64 KiB")
        try:
            changes[path.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            changes[path.strip()] = raw
    return changes
