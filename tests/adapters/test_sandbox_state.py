"""What the sandbox denies of the control plane's state: its files, never a folder that holds
the Python environment (issue 31, item 9)."""

from __future__ import annotations

from pathlib import Path

from trainhub.adapters.sandbox import inseparable, safe_mounts, sqlite_state_files


def test_a_database_beside_the_venv_leaves_the_venv_mountable(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    for folder in (".venv/bin", "src/trainhub"):
        (clone / folder).mkdir(parents=True)
    denied = sqlite_state_files(str(clone / "th.db"))
    suffixes = ("", "-wal", "-shm", "-journal")
    assert denied == [f"{clone / db}{s}" for db in ("th.db", "th-optuna.db") for s in suffixes]
    kept = safe_mounts([str(clone / ".venv"), str(clone / "src"), str(clone)], denied)
    # the environment is mounted; the clone itself (it holds th.db) is not
    assert sorted(kept) == [str(clone / ".venv"), str(clone / "src")]
    assert inseparable(denied, [str(clone / ".venv"), str(clone / "src")]) is None


def test_state_inside_the_environment_cannot_be_separated_and_both_are_named(
    tmp_path: Path,
) -> None:
    venv = tmp_path / ".venv"
    denied = [str(tmp_path / "home"), *sqlite_state_files(str(venv / "th.db"))]
    assert inseparable(denied, [str(venv)]) == (str(venv / "th.db"), str(venv))
    # a --home that holds the environment would hide it: the same
    assert inseparable([str(tmp_path)], [str(venv)]) == (str(tmp_path), str(venv))
    assert inseparable([str(tmp_path / "other")], [str(venv)]) is None
