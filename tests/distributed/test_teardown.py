"""DDP models the runtime prepared lose their reducer in the exit hook, before interpreter
shutdown, where destroying it can abort a gloo process (trainhub.runtime.distributed.teardown)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.launch import run_ranks
from trainhub.runtime.distributed import DistributedConfig, apply_strategy, teardown

pytestmark = pytest.mark.slow


def _prepare_then_exit_hook(rank: int, world: int) -> dict[str, bool]:
    prepared = apply_strategy(torch.nn.Linear(4, 2), DistributedConfig(), device="cpu")
    prepared.model(torch.randn(3, 4)).sum().backward()
    registered = prepared.model in teardown._models
    teardown.release_reducers()  # what the exit hook runs
    return {"registered": registered, "reducer_left": "reducer" in vars(prepared.model)}


def test_prepared_ddp_models_lose_their_reducer_in_the_exit_hook() -> None:
    for result in run_ranks(_prepare_then_exit_hook):
        assert result == {"registered": True, "reducer_left": False}
