"""`trainhub show` prints layer health and its alerts with the step and the layer."""

from __future__ import annotations

from tests.api.trials import start_attempt
from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import submit


def test_show_prints_the_layer_table_and_the_alerts(cli: Cli, live: LiveServer) -> None:
    trial_id = submit(live)["trial_ids"][0]
    own = start_attempt(live.api, trial_id)
    values = {
        "loss": 0.7,
        "layers/features.0/grad_norm": 0.25,
        "layers/features.0/weight_norm": 1.5,
        "layers/features.1/dead_fraction": 0.95,
        "layers/classifier.3/nonfinite": 1.0,
    }
    r = live.api.client.post(
        f"/api/v1/trials/{trial_id}/metrics",
        json={"points": [{"step": 40, "values": values}]},
        headers=own,
    )
    assert r.status_code == 200, r.text
    result = cli("show", "--trial", str(trial_id))
    assert result.exit_code == 0, result.output
    out = result.stdout
    latest = out[out.index("latest metrics") : out.index("layer health")]
    assert "loss" in latest
    assert "layers/" not in latest  # layer series get their own table
    health = out[out.index("layer health") : out.index("layer alerts")]
    assert "features.0" in health
    assert "grad norm" in health
    assert "0.25" in health
    alerts = out[out.index("layer alerts") :]
    assert "nonfinite" in alerts
    assert "classifier.3" in alerts
    assert "dead_layer" in alerts
    assert "features.1" in alerts
    assert "40" in alerts


def test_the_layer_table_lists_layers_in_order() -> None:
    from trainhub.cli.layer_health import layer_table

    metrics = {
        "layers/blocks.10.fc/grad_norm": 1.0,
        "layers/blocks.2.fc/grad_norm": 1.0,
        "layers/1/act_mean": 0.1,
        "layers/0/grad_norm": 1.0,
        "layers/blocks.2.act/dead_fraction": 0.5,
    }
    table = layer_table(metrics)
    assert table is not None
    names = [str(cell) for cell in table.columns[0]._cells]
    assert names == ["0", "1", "blocks.2.act", "blocks.2.fc", "blocks.10.fc"]
