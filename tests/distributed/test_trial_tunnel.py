"""A contained trial across two "hosts" (the network namespaces of tests/distributed/netns.py,
a Ray node in each): its ranks reach each other's ports through the trial's tunnel, and nothing
else; another trial on the same two nodes cannot reach them (tests/distributed/trial_tunnel.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tests.distributed.netns import two_host_cluster, unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _problem() -> str | None:
    from trainhub.adapters.cgroups import cgroup_problem
    from trainhub.adapters.sandbox import bwrap_problem
    from trainhub.adapters.seccomp import SeccompUnavailable, compiled_filter
    from trainhub.adapters.trial_network import network_problem
    from trainhub.adapters.trial_tunnel import tunnel_problem
    from trainhub.core.isolation import DENIED_SYSCALLS

    for check in (unavailable_reason, bwrap_problem, cgroup_problem, network_problem):
        problem = check()
        if problem:
            return problem
    problem = tunnel_problem()
    if problem:
        return f"no tunnel between a trial's nodes: {problem}"
    try:
        compiled_filter(DENIED_SYSCALLS)
    except SeccompUnavailable as exc:
        return str(exc)
    return None


REASON = _problem()


def lines_of(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(word)]


@pytest.mark.skipif(REASON is not None, reason=f"trial tunnel test: {REASON}")
def test_a_trial_across_nodes_reaches_its_own_ranks_only() -> None:
    work = Path(tempfile.mkdtemp(prefix="thtun-", dir="/tmp"))
    with two_host_cluster(cpus_per_node=2) as cluster:
        cluster.env["TUNNEL_WORK_DIR"] = str(work)
        found = cluster.run_driver(["-m", "tests.distributed.trial_tunnel"], timeout_s=600)
    result = found[-1]
    x, y = result["x"], result["y"]
    assert isinstance(x, dict)
    assert isinstance(y, dict)
    report = json.dumps(result, indent=1)
    # the script's own env:// rendezvous and gloo's all-reduce went through the tunnel
    for rank in ("0", "1"):
        assert lines_of(x[rank], "ALLREDUCE") == ["ALLREDUCE 3.0 100.64.0.1"], report
        assert "DONE" in x[rank] or rank == "0", report
    assert lines_of(x["1"], "PEER_SAYS") == ["PEER_SAYS hello"], report
    accepted = lines_of(x["0"], "ACCEPTED")
    assert accepted == ["ACCEPTED 100.64.0.2"], report  # rank 1 only: no other trial's
    assert result["y_codes"] == [0, 0], report
    # another trial on the same nodes: its 100.64.0.1 is its own rank 0, where nothing serves
    assert "PROBE other_trials_rank0 ECONNREFUSED" in y["1"], report
    for trial in (x, y):
        for rank in ("0", "1"):
            for name in ("postgres_head", "ray_gcs_head"):
                assert f"PROBE {name} ENETUNREACH" in trial[rank], report
            assert "PROBE postgres_loopback ECONNREFUSED" in trial[rank], report
    assert result["netns_left"] == [], report  # both ends of both tunnels removed
