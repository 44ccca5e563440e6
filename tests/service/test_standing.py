"""Tenant standings in the server: kept tick by tick, and rebuilt from the database at start.

The fair policy's reclaim patience reads how much of its entitlement each tenant received
(core.entitlement). The control loop keeps that ledger; a restarted server must not forget it,
or every tenant would look unserved and reclaim at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.loop_harness import LoopHarness, cpu_nodes
from trainhub.core.scheduling import FairShareConfig, FairSharePolicy
from trainhub.service.control_loop import ControlLoop, LoopConfig

HALF_LIFE_S = 6 * 3600.0


def spec(gpus: int) -> str:
    return (
        "name: job\nentrypoint: sleep 1\n"
        f"resources: {{workers: 1, gpus_per_worker: {gpus}, cpus_per_worker: 1}}\n"
    )


def policy() -> FairSharePolicy:
    return FairSharePolicy(FairShareConfig(standing_half_life_s=HALF_LIFE_S))


def test_a_restarted_server_rebuilds_the_standings_it_kept(tmp_path: Path) -> None:
    h = LoopHarness(tmp_path, policy(), cpu_nodes(1, cpus=8, gpus=4))
    try:
        h.clock.now = 0.0
        h.admin.create_tenant(h.principal, "a", 4)
        first = h.submit(spec(2), tenant="a")
        second = h.submit(spec(4), tenant="a")  # waits: a demands 6, is entitled to 4, gets 2
        assert h.tick().started == [first]
        h.executor.run(h.key(first))
        h.clock.now = 3600.0
        h.tick()
        h.executor.exit(h.key(first), [0])
        h.clock.now = 5400.0
        assert h.tick().started == [second]
        h.executor.run(h.key(second))
        h.clock.now = 9000.0
        h.tick()
        ledger = h.loop.view.standing
        assert ledger is not None
        kept = ledger.standing(9000.0)["a"]
        # 2 of 4 for 5,400 s, then 4 of 4: well below, then fully served
        assert 0.5 < kept.received_slot_s / kept.entitled_slot_s < 0.9

        restarted = ControlLoop(
            h.uow, h.executor, h.store, policy(), LoopConfig("http://127.0.0.1:1"), h.clock
        )
        restarted.tick()
        assert restarted.view.standing is not None
        rebuilt = restarted.view.standing.standing(9000.0)["a"]
        assert rebuilt.entitled_slot_s == pytest.approx(kept.entitled_slot_s, rel=1e-9)
        assert rebuilt.received_slot_s == pytest.approx(kept.received_slot_s, rel=1e-9)
    finally:
        h.close()


def test_a_policy_without_patience_keeps_no_ledger(tmp_path: Path) -> None:
    eager = FairSharePolicy(FairShareConfig(patience_share=None))
    h = LoopHarness(tmp_path, eager, cpu_nodes(1, cpus=8, gpus=4))
    try:
        h.submit(spec(1))
        h.tick()
        assert h.loop.view.standing is None
    finally:
        h.close()
