"""On a machine with CUDA GPUs: an unmodified torchrun DDP script trains with NCCL through the
executor, every rank on its own GPU picked by ``LOCAL_RANK``. Skipped without a GPU."""

from __future__ import annotations

import textwrap

import pytest

from tests.fixtures.ray_cluster import Watch, make_context, new_attempt_key
from trainhub.adapters.ray_executor import RayExecutor
from trainhub.service.ports import AttemptLaunch, AttemptPhase

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)  # the line every torchrun script has
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(32, 1).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(256, 32, device="cuda"), torch.randn(256, 1, device="cuda")
    first = None
    for _ in range(50):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        first = first if first is not None else loss.item()
    uuid = torch.cuda.get_device_properties(local_rank).uuid
    print("GPU", os.environ["CUDA_VISIBLE_DEVICES"], local_rank, uuid, first, loss.item(),
          flush=True)
    dist.destroy_process_group()
    """
)


def test_unmodified_torchrun_script_trains_on_gpus(ray_executor: RayExecutor) -> None:
    free = [n for n in ray_executor.cluster_nodes() if n.free_gpus >= 1]
    if not free:
        pytest.skip("Ray sees no free GPU")
    node = max(free, key=lambda n: n.free_gpus)
    workers = min(2, node.free_gpus)
    launch = AttemptLaunch(
        attempt_key=new_attempt_key("gpu"),
        trial_id=1,
        attempt=1,
        argv=("python", "train.py"),
        context_archive=make_context({"train.py": TORCHRUN_SCRIPT}),
        env={},
        placement=(node.node_id,) * workers,
        gpus_per_worker=1,
    )
    ray_executor.launch(launch)
    watch = Watch(ray_executor, launch.attempt_key)
    try:
        status = watch.until_phase(AttemptPhase.EXITED, timeout_s=300)
        lines = [
            next(line for line in watch.text(r).splitlines() if line.startswith("GPU "))
            for r in range(workers)
        ]
        assert all(r.exit_code == 0 for r in status.ranks), watch.logs
    finally:
        ray_executor.release(launch.attempt_key)
    fields = [line.split() for line in lines]
    assert len({f[1] for f in fields}) == 1  # one CUDA_VISIBLE_DEVICES for the node's ranks
    assert sorted(f[2] for f in fields) == [str(r) for r in range(workers)]
    assert len({f[3] for f in fields}) == workers  # every rank on a GPU of its own
    assert all(float(f[5]) < float(f[4]) for f in fields)  # it trained
