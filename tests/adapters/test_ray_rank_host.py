"""Ranks run by the node's rank host (rank_host.py, ADR 0031) against a real local Ray head: the
executor's own tests run again with hosted ranks (every launch must be hosted here: a rank that
asks for an actor of its own fails the test), then what is particular to a host: no Ray actor
per rank, no slot held, a control plane that restarts finds hosted ranks, a host that dies
loses its ranks, and ranks with GPUs keep their own actor."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.adapters.test_ray_executor import (  # the same tests, on hosted ranks
    SLEEPER,
    make_launch,
    pids_in,
    run,
    test_failing_rank_is_reported_and_stops_the_gang,
    test_gloo_all_reduce_across_two_ranks,
    test_log_offsets_resume_without_gaps_or_repeats,
    test_missing_command_exits_127_with_a_message,
    test_rank_killed_with_sigkill_shows_minus_9,
    test_release_frees_resources_and_files,
    test_terminate_kills_the_whole_process_tree,
    test_terminate_with_sigterm_ends_a_cooperative_rank,
    test_two_ranks_exit_zero_with_torchrun_env_and_logs,
    test_unknown_and_placing_attempts,
    wait_gone,
)
from tests.fixtures.ray_cluster import TEST_NAMESPACE, Watch
from trainhub.adapters.ray_executor import RayExecutor, rank_host
from trainhub.service.ports import AttemptPhase, RankPhase

pytestmark = pytest.mark.ray

__all__ = [
    "run",
    "test_failing_rank_is_reported_and_stops_the_gang",
    "test_gloo_all_reduce_across_two_ranks",
    "test_log_offsets_resume_without_gaps_or_repeats",
    "test_missing_command_exits_127_with_a_message",
    "test_rank_killed_with_sigkill_shows_minus_9",
    "test_release_frees_resources_and_files",
    "test_terminate_kills_the_whole_process_tree",
    "test_terminate_with_sigterm_ends_a_cooperative_rank",
    "test_two_ranks_exit_zero_with_torchrun_env_and_logs",
    "test_unknown_and_placing_attempts",
]


def _hosts_ready(executor: RayExecutor, timeout_s: float = 120.0) -> None:
    import ray

    nodes = [n.node_id for n in executor.cluster_nodes()]
    deadline = time.monotonic() + timeout_s
    while True:
        executor._ensure_hosts()
        refs = [executor._hosts[n][1] for n in nodes if n in executor._hosts]
        if len(refs) == len(nodes):
            try:
                ray.get(refs, timeout=max(1.0, deadline - time.monotonic()))
                return
            except ray.exceptions.RayError:
                executor._hosts.clear()
        if time.monotonic() > deadline:
            raise AssertionError("the rank hosts did not start")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def hosted_executor(ray_address: str) -> RayExecutor:
    executor = RayExecutor(
        ray_address, namespace=TEST_NAMESPACE, fail_fast_grace_s=5.0, hosted_ranks=True
    )
    _hosts_ready(executor)
    return executor


@pytest.fixture
def ray_executor(hosted_executor: RayExecutor, monkeypatch: pytest.MonkeyPatch) -> RayExecutor:
    """The executor every test of this module uses: hosted ranks, never an actor per rank."""

    def no_actor(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a rank got an actor of its own: the rank host did not take it")

    monkeypatch.setattr(hosted_executor, "_create_rank_actor", no_actor)
    return hosted_executor


@pytest.fixture
def hosted_run(ray_executor: RayExecutor) -> Iterator[Any]:
    launched: list[str] = []

    def start(launch: Any) -> Watch:
        ray_executor.launch(launch)
        launched.append(launch.attempt_key)
        return Watch(ray_executor, launch.attempt_key)

    yield start
    for key in launched:
        ray_executor.release(key)


def test_a_hosted_rank_is_no_actor_and_holds_no_slot_beyond_its_bundle(
    ray_executor: RayExecutor, hosted_run: Any
) -> None:
    import ray

    launch = make_launch(ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py"))
    watch = hosted_run(launch)
    watch.until(lambda s: all(pids_in(watch.text(r)) for r in (0, 1)))

    names = {e["name"] for e in ray.util.list_named_actors(all_namespaces=True)}
    assert f"{launch.attempt_key}-rank0" not in names  # no actor of its own
    assert launch.attempt_key in ray_executor.live_attempts()
    node = ray_executor.cluster_nodes()[0]
    assert node.free_cpus == node.total_cpus - 2  # the bundles only; the host holds nothing


def test_a_new_executor_finds_and_stops_hosted_ranks(
    ray_address: str, ray_executor: RayExecutor, hosted_run: Any
) -> None:
    launch = make_launch(ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py"))
    watch = hosted_run(launch)
    watch.until(lambda s: all(pids_in(watch.text(r)) for r in (0, 1)))
    pids = [pids_in(watch.text(r))[0] for r in (0, 1)]

    fresh = RayExecutor(ray_address, namespace=TEST_NAMESPACE)  # a restarted control plane
    assert launch.attempt_key in fresh.live_attempts()
    again = Watch(fresh, launch.attempt_key)
    assert again.poll().phase == AttemptPhase.RUNNING
    fresh.terminate(launch.attempt_key, grace_s=5.0)
    assert again.until_phase(AttemptPhase.EXITED, timeout_s=30).phase == AttemptPhase.EXITED
    fresh.release(launch.attempt_key)
    assert launch.attempt_key not in fresh.live_attempts()
    assert wait_gone(pids) == []


def test_a_dead_host_loses_its_ranks_and_a_new_one_serves_the_next_attempt(
    ray_executor: RayExecutor, hosted_run: Any
) -> None:
    import ray

    watch = hosted_run(make_launch(ray_executor, {"sleep.py": SLEEPER}, ("python", "sleep.py")))
    watch.until(lambda s: all(pids_in(watch.text(r)) for r in (0, 1)))
    pids = [pids_in(watch.text(r))[0] for r in (0, 1)]
    node = ray_executor.cluster_nodes()[0].node_id

    ray.kill(rank_host.find_host(TEST_NAMESPACE, node), no_restart=False)  # it crashes
    status = watch.until_phase(AttemptPhase.LOST, timeout_s=60)

    assert {r.phase for r in status.ranks} == {RankPhase.LOST}
    assert wait_gone(pids) == []  # the ranks' processes die with their host
    ray_executor._hosts.clear()
    _hosts_ready(ray_executor)  # restarted by Ray
    again = hosted_run(make_launch(ray_executor, {}, ("python", "-c", "print('ok')")))
    assert again.until_phase(AttemptPhase.EXITED, timeout_s=60).ranks[0].exit_code == 0


def test_gpu_ranks_keep_an_actor_of_their_own(hosted_executor: RayExecutor) -> None:
    node = hosted_executor.cluster_nodes()[0].node_id
    launch = make_launch(hosted_executor, {}, ("true",), gpus_per_worker=1)
    assert hosted_executor._ready_hosts(launch, exact=True) is None
    cpu = make_launch(hosted_executor, {}, ("true",))
    assert set(hosted_executor._ready_hosts(cpu, exact=True) or {}) == {node}
    assert hosted_executor._ready_hosts(cpu, exact=False) is None  # placed by Ray: nodes unknown
