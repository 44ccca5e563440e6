"""The sandbox's pure parts: what is mounted, the command line, the environment allow-list, and
how ``auto`` resolves where bwrap is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainhub.adapters import sandbox
from trainhub.adapters.sandbox import (
    Mount,
    SandboxMode,
    SandboxPlan,
    SandboxUnavailable,
    bwrap_argv,
    rank_environment,
    resolve_mode,
    safe_mounts,
)


def test_safe_mounts_never_carry_control_plane_state(tmp_path: Path) -> None:
    home = tmp_path / "cp-home"
    (home / "venv").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "pkg").mkdir()
    kept = safe_mounts(
        [
            str(tmp_path),  # contains the control plane's home: refused
            str(home / "venv"),  # inside it: refused
            str(tmp_path / "src" / "pkg"),  # inside a kept folder: folded into it
            str(tmp_path / "src"),
            "/",  # the whole machine: refused
            str(tmp_path / "missing"),  # does not exist: nothing to mount
        ],
        denied=[str(home)],
    )
    assert kept == [str(tmp_path / "src")]


def test_safe_mounts_refuse_the_user_home_and_what_the_sandbox_makes() -> None:
    # a script's folder in sys.path may be /tmp: mounted, it would hide the private /tmp
    assert safe_mounts([str(Path.home()), "/tmp", "/proc", "/dev"], denied=[]) == []


def test_unprivileged_plan_drops_every_capability() -> None:
    plan = SandboxPlan(
        mounts=(Mount("/data/code", "/trial/code"), Mount("/data/ck", "/trial/ck", True)),
        cwd="/trial/code",
    )
    argv = bwrap_argv("/bin/bwrap", plan, ["python", "train.py"])
    assert argv[0] == "/bin/bwrap"
    assert argv[-3:] == ["--", "python", "train.py"]
    for flag in ("--unshare-pid", "--unshare-user", "--die-with-parent"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    joined = " ".join(argv)
    assert "--ro-bind /data/code /trial/code" in joined
    assert "--bind /data/ck /trial/ck" in joined
    assert "--chdir /trial/code" in joined
    assert "--new-session" not in argv  # the rank stays in the group the executor signals


def test_root_plan_drops_to_the_trial_uid_inside() -> None:
    argv = bwrap_argv("/bin/bwrap", SandboxPlan(mounts=(), cwd="/", uid=200_007), ["true"])
    assert "--unshare-user" not in argv  # bwrap stays root to build the view ...
    setpriv = argv.index("--") + 1
    assert argv[setpriv].endswith("setpriv")  # ... and the rank does not
    assert "--reuid=200007" in argv
    assert "--regid=200007" in argv
    assert "--bounding-set=-all" in argv
    assert "--no-new-privs" in argv


def test_environment_is_an_allow_list() -> None:
    node = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "RAY_AUTH_TOKEN": "secret",
        "TRAINHUB_DB_URL": "postgresql://u:pw@db/x",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "OMP_NUM_THREADS": "2",
        "NCCL_SOCKET_IFNAME": "eth1",
    }
    env = rank_environment(
        launch={"TRAINHUB_TOKEN": "th_x", "MY_FLAG": "1"},
        node=node,
        computed={"RANK": "0", "PATH": "/venv/bin:/usr/bin", "HOME": "/trial/home"},
    )
    assert env == {
        "TRAINHUB_TOKEN": "th_x",
        "MY_FLAG": "1",
        "RANK": "0",
        "PATH": "/venv/bin:/usr/bin",
        "HOME": "/trial/home",
        "OMP_NUM_THREADS": "2",
        "NCCL_SOCKET_IFNAME": "eth1",
    }


def test_auto_falls_back_to_none_with_a_reason_where_bwrap_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    sandbox.bwrap_problem.cache_clear()
    try:
        mode, why = resolve_mode("auto")
        assert mode == SandboxMode.NONE
        assert why is not None
        assert "NOT sandboxed" in why
        assert "bubblewrap" in why
        with pytest.raises(SandboxUnavailable, match="no bwrap"):
            resolve_mode("bwrap")
        assert resolve_mode("none")[0] == SandboxMode.NONE
    finally:
        sandbox.bwrap_problem.cache_clear()


def test_auto_is_bwrap_where_it_works() -> None:
    problem = sandbox.bwrap_problem()
    if problem is not None:
        pytest.skip(f"no sandbox here: {problem}")
    assert resolve_mode("auto") == (SandboxMode.BWRAP, None)
