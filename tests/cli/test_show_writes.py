"""`trainhub show --trial` shows what the trial wrote against its caps (issue 24)."""

from __future__ import annotations

from tests.cli.conftest import Cli, LiveServer
from tests.cli.helpers import start, submit


def test_show_a_trial_with_its_writes_and_caps(cli: Cli, live: LiveServer) -> None:
    exp = submit(live)
    trial_id = exp["trial_ids"][0]
    start(live, trial_id)
    with live.api.services.uow() as repo:
        repo.add_metric_counts(trial_id, 2500, 500)
        repo.record_disk_bytes({trial_id: 3_000_000_000})
    result = cli("show", "--trial", str(trial_id))
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "2,500 metric points of 1,000,000 (at most 6,000 a minute)" in out
    assert "500 dropped past the cap" in out
    assert "3 GB in its folders on its nodes" in out
