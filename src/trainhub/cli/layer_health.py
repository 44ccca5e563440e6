"""How ``trainhub show`` prints layer health: the latest ``layers/*`` metrics and the alerts."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from trainhub.cli.render import fmt_value, titled_table

LAYER_PREFIX = "layers/"
_COLUMNS = (
    ("grad_norm", "grad norm"),
    ("weight_norm", "weight norm"),
    ("update_ratio", "update/weight"),
    ("act_mean", "act mean"),
    ("act_std", "act std"),
    ("dead_fraction", "dead"),
    ("saturated_fraction", "saturated"),
)
_ALERT_STYLES = {"nonfinite": "bold red", "exploding_gradients": "red"}


def split_layer_metrics(latest: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the other metrics, the ``layers/*`` ones)."""
    other: dict[str, Any] = {}
    layers: dict[str, Any] = {}
    for key, value in latest.items():
        (layers if key.startswith(LAYER_PREFIX) else other)[key] = value
    return other, layers


def layer_table(layer_metrics: Mapping[str, Any]) -> Table | None:
    """One row per watched layer, one column per statistic it has (latest values)."""
    rows: dict[str, dict[str, Any]] = {}
    for key, value in layer_metrics.items():
        layer, _, stat = key[len(LAYER_PREFIX) :].rpartition("/")
        if layer and stat != "nonfinite":
            rows.setdefault(layer, {})[stat] = value
    if not rows:
        return None
    shown = [(stat, title) for stat, title in _COLUMNS if any(stat in r for r in rows.values())]
    table = titled_table("layer health (latest sample)")
    table.add_column("layer")
    for _, title in shown:
        table.add_column(title, justify="right")
    for layer, stats in sorted(rows.items(), key=lambda row: _natural(row[0])):
        table.add_row(Text(layer), *(fmt_value(stats[s]) if s in stats else "" for s, _ in shown))
    return table


def _natural(layer: str) -> list[tuple[int, int | str]]:
    """``blocks.10.conv`` after ``blocks.2.conv``: numbers compare as numbers."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", layer) if p]


def alerts_table(alerts: Sequence[Mapping[str, Any]]) -> Table:
    table = titled_table("layer alerts")
    table.add_column("step", justify="right")
    table.add_column("layer")
    table.add_column("alert")
    table.add_column("message")
    for a in alerts:
        steps = str(a["step"])
        if a.get("last_step", a["step"]) != a["step"]:
            steps += f"..{a['last_step']}"
        table.add_row(
            steps,
            Text(a["layer"]),
            Text(a["kind"], style=_ALERT_STYLES.get(a["kind"], "yellow")),
            Text(a["message"]),
        )
    return table
