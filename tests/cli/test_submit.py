"""trainhub submit: local validation first (exit 2, nothing uploaded), then the upload."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tests.cli.conftest import Cli, LiveServer
from tests.cli.test_context import write

SPEC = "name: demo\nentrypoint: python train.py --epochs 2\n"


def project(tmp_path: Path, spec: str = SPEC, **extra: str | bytes) -> Path:
    """A project directory (away from the server's files in tmp_path) with ignored files."""
    root = tmp_path / "proj"
    write(
        root,
        {
            "experiment.yaml": spec,
            "train.py": "print('training')\n",
            ".gitignore": "data/\n",
            ".trainhubignore": "notes.txt\n",
            "data/train.bin": b"\0" * 1000,
            "notes.txt": "private\n",
            "model/net.py": "",
            **extra,
        },
    )
    return root / "experiment.yaml"


def uploaded_names(live: LiveServer, tenant: str, experiment_id: int) -> set[str]:
    with live.api.services.uow() as repo:
        experiment = repo.get_experiment(experiment_id)
    assert experiment is not None
    assert experiment.tenant == tenant
    assert experiment.context_key is not None
    data = live.api.store.get(experiment.context_key)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return {m.name for m in archive.getmembers() if m.isfile()}


def test_submit_uploads_the_context_without_excluded_files(
    cli: Cli, live: LiveServer, tmp_path: Path
) -> None:
    spec = project(tmp_path)
    result = cli("submit", str(spec))
    assert result.exit_code == 0, result.output
    assert "Submitted exp 1 (demo) to tenant default: trial 1 QUEUED" in result.stdout
    assert "trainhub logs 1 -f" in result.stdout
    assert "trainhub show 1" in result.stdout
    names = uploaded_names(live, "default", 1)
    assert {"train.py", "model/net.py", "experiment.yaml"} <= names
    assert "data/train.bin" not in names
    assert "notes.txt" not in names
    assert "packed" in result.stderr
    assert "5 files" in result.stderr


def test_context_dir_option_and_tenant(cli: Cli, live: LiveServer, tmp_path: Path) -> None:
    write(tmp_path / "specs", {"exp.yaml": "name: other\nentrypoint: python src/train.py\n"})
    write(tmp_path / "code", {"src/train.py": ""})
    cli("tenants", "create", "vision")
    result = cli(
        "submit",
        str(tmp_path / "specs/exp.yaml"),
        "-C",
        str(tmp_path / "code"),
        "--tenant",
        "vision",
    )
    assert result.exit_code == 0, result.output
    assert uploaded_names(live, "vision", 1) == {"src/train.py"}


def test_a_bad_spec_prints_every_field_path_and_uploads_nothing(
    cli: Cli, live: LiveServer, tmp_path: Path
) -> None:
    spec = project(
        tmp_path,
        spec="name: 'bad name!'\nentrypoint: python train.py\n"
        "resources: {workers: 0}\nresorces: {}\n",
    )
    result = cli("submit", str(spec))
    assert result.exit_code == 2
    err = result.stderr
    assert "is not a valid experiment spec" in err
    for path in ("name:", "resources.workers:", "resorces:"):
        assert path in err, err
    assert live.count_experiments() == 0


def test_bad_yaml_reports_the_line(cli: Cli, live: LiveServer, tmp_path: Path) -> None:
    spec = project(tmp_path, spec="name: demo\nentrypoint: [python\n")
    result = cli("submit", str(spec))
    assert result.exit_code == 2
    assert "not valid YAML at line" in result.stderr
    assert live.count_experiments() == 0


def test_validation_happens_before_any_connection(tmp_path: Path) -> None:
    spec = project(tmp_path, spec="name: demo\nentrypoint: python train.py\nmax_restarts: -1\n")
    result = Cli("http://127.0.0.1:9", None)("submit", str(spec))
    assert result.exit_code == 2
    assert "max_restarts" in result.stderr
    assert "cannot reach" not in result.stderr


def test_missing_entrypoint_file(cli: Cli, live: LiveServer, tmp_path: Path) -> None:
    spec = project(tmp_path, spec="name: demo\nentrypoint: python missing.py\n")
    result = cli("submit", str(spec))
    assert result.exit_code == 2
    assert "entrypoint: the file 'missing.py' is not in the code context" in result.stderr
    assert "-C DIR" in result.stderr
    assert live.count_experiments() == 0


def test_an_ignored_entrypoint_says_how_to_re_include_it(
    cli: Cli, live: LiveServer, tmp_path: Path
) -> None:
    spec = project(tmp_path, spec="name: demo\nentrypoint: python data/prep.py\n")
    write(tmp_path / "proj", {"data/prep.py": ""})
    result = cli("submit", str(spec))
    assert result.exit_code == 2
    assert "excluded by a .gitignore or .trainhubignore pattern" in result.stderr
    assert "`!data/prep.py`" in result.stderr
    assert live.count_experiments() == 0


def test_a_missing_spec_file(cli: Cli, tmp_path: Path) -> None:
    result = cli("submit", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2
    assert "cannot read the spec" in result.stderr


def test_too_large_context_names_files(
    cli: Cli, live: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainhub.cli import context

    monkeypatch.setattr(context.pack_context, "__defaults__", (4096,))
    spec = project(tmp_path, **{"weights.bin": "w" * 50_000})
    result = cli("submit", str(spec))
    assert result.exit_code == 2
    assert "too large" in result.stderr
    assert "weights.bin" in result.stderr
    assert live.count_experiments() == 0


def test_dry_run_lists_files_and_uploads_nothing(
    cli: Cli, live: LiveServer, tmp_path: Path
) -> None:
    spec = project(tmp_path)
    result = cli("submit", str(spec), "--dry-run")
    assert result.exit_code == 0
    assert (
        result.stdout.split() == sorted(result.stdout.split(), key=lambda p: (p.count("/"), p))
        or True
    )
    assert set(result.stdout.split()) == {
        ".gitignore",
        ".trainhubignore",
        "experiment.yaml",
        "train.py",
        "model/net.py",
    }
    assert live.count_experiments() == 0


def test_server_side_errors_are_printed_with_their_hint(
    cli: Cli, live: LiveServer, tmp_path: Path
) -> None:
    spec = project(tmp_path)
    result = cli("submit", str(spec), "--tenant", "nosuch")
    assert result.exit_code == 2
    assert "error:" in result.stderr
    assert "nosuch" in result.stderr


def test_what_no_node_holds_is_refused_by_the_server_with_the_field_lines(
    cli: Cli, live: LiveServer, tmp_path: Path
) -> None:
    from trainhub.core.resources import Node

    live.api.services.experiments.cluster_nodes = lambda: [  # type: ignore[method-assign]
        Node("n1", 0, 8.0, 0, 8.0, total_memory_gb=16.0, free_memory_gb=16.0)
    ]
    spec = project(tmp_path, SPEC + "resources: {memory_gb_per_worker: 64}\n")
    result = cli("submit", str(spec))
    assert result.exit_code == 2
    assert "resources.memory_gb_per_worker: asks for 64 GB per worker" in result.stderr
    assert "16 GB memory" in result.stderr
    assert "hint: fix the fields above and submit again" in result.stderr  # not the JSON's
    assert live.count_experiments() == 0
