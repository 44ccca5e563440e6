"""GPU views through real Ray on a head that advertises 4 GPUs this machine lacks, and
``trainhub server stop`` ending the head a server started.

The executor runs in a child process: this test process is connected to the session's head,
and a process talks to one Ray cluster only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainhub.adapters.ray_executor.local_cluster import _head_processes, read_record
from trainhub.server import PID_FILE, stop_server

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from tests.fixtures.ray_cluster import Watch, make_context
    from trainhub.adapters.ray_executor import RayExecutor, ensure_local_ray
    from trainhub.service.ports import AttemptLaunch, AttemptPhase

    home = Path(sys.argv[1])
    address = ensure_local_ray(home / "ray", num_cpus=4, num_gpus=4)
    executor = RayExecutor(address, namespace="gpu-test", fail_fast_grace_s=None)
    node = executor.cluster_nodes()[0]
    assert node.total_gpus == 4, node
    report = "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    report += "('CUDA_VISIBLE_DEVICES', 'LOCAL_RANK')}))"
    context = make_context({"report.py": report})
    watches = []
    for trial in (1, 2):
        launch = AttemptLaunch(
            attempt_key=f"gpus-t{trial}", trial_id=trial, attempt=1,
            argv=("python", "report.py"), context_archive=context, env={},
            placement=(node.node_id,) * 2, gpus_per_worker=1, cpus_per_worker=1,
        )
        executor.launch(launch)
        watches.append(Watch(executor, launch.attempt_key))
    out = {}
    for trial, watch in enumerate(watches, 1):
        status = watch.until_phase(AttemptPhase.EXITED, timeout_s=120)
        assert all(r.exit_code == 0 for r in status.ranks), (status, watch.logs)
        out[trial] = [json.loads(watch.text(r).splitlines()[0]) for r in (0, 1)]
        executor.release(watch.attempt_key)
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_two_trials_on_a_four_gpu_node_and_server_stop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    try:
        result = subprocess.run(
            [sys.executable, "-c", DRIVER, str(home)],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
            cwd=REPO,
            check=False,
        )
        line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
        assert line is not None, result.stdout[-3000:] + result.stderr[-3000:]
        seen = json.loads(line[len("RESULT ") :])
        views = []
        for trial in ("1", "2"):
            ranks = seen[trial]
            visible = {r["CUDA_VISIBLE_DEVICES"] for r in ranks}
            assert len(visible) == 1  # both ranks of a trial see the same list ...
            devices = visible.pop().split(",")
            assert len(devices) == 2  # ... of the trial's two GPUs of the node
            assert sorted(r["LOCAL_RANK"] for r in ranks) == ["0", "1"]
            views.append(set(devices))
        assert not views[0] & views[1]  # two trials on one node never share a GPU
        assert views[0] | views[1] == {"0", "1", "2", "3"}
    finally:
        # `trainhub server stop` ends the head this home started (and a server, if recorded)
        record = read_record(home / "ray")
        sleeper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)  # trainhub server"]
        )
        (home / PID_FILE).write_text(f"{sleeper.pid}\n")
        _until_executed(sleeper.pid, "trainhub server")  # not the forked test process yet
        stopped = stop_server(home)
        assert sleeper.wait(10) is not None
        assert not (home / PID_FILE).exists()
    assert record is not None
    assert any("Ray head" in s for s in stopped)
    assert _head_processes(record, with_descendants=True) == []


def _until_executed(pid: int, marker: str, timeout_s: float = 10.0) -> None:
    """Wait until ``pid`` runs its own command line: between fork and exec it still shows the
    test process's, which ``stop_server`` rightly does not take for a server."""
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while marker not in " ".join(psutil.Process(pid).cmdline()):
        assert time.monotonic() < deadline, psutil.Process(pid).cmdline()
        time.sleep(0.01)
