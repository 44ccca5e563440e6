"""The spec's data list and the rules of a dataset mount: plain values."""

from __future__ import annotations

import pytest

from trainhub.adapters import sandbox
from trainhub.core.dataset_spec import PROTECTED_PATHS, mount_error, mount_errors, split_ref
from trainhub.core.errors import InvalidSpec
from trainhub.core.spec import parse_spec

SPEC = "name: x\nentrypoint: python t.py\n"


def paths(errors: list) -> list[str]:  # type: ignore[type-arg]
    return [e.path for e in errors]


@pytest.mark.parametrize(
    "mount",
    ["/data/imagenet", "/datasets/a/b", "/mnt/team", "/home2/data", "/srv/x", "/data"],
)
def test_plain_absolute_paths_are_fine(mount: str) -> None:
    assert mount_error(mount, PROTECTED_PATHS) is None


@pytest.mark.parametrize(
    ("mount", "words"),
    [
        ("data/x", "relative"),
        ("./x", "relative"),
        ("/", "whole system"),
        ("/usr", "/usr"),
        ("/usr/local/data", "/usr"),
        ("/etc/x", "/etc"),
        ("/tmp", "/tmp"),
        ("/tmp/data", "/tmp"),
        ("/proc/1", "/proc"),
        ("/dev/shm/x", "/dev"),
        ("/trial", "/trial"),
        ("/trial/code", "/trial"),
        ("/lib64/x", "/lib64"),
        ("/data/../usr", "'..'"),
        ("/data/./x", "'.'"),
        ("/da\x00ta", "NUL"),
    ],
)
def test_paths_that_shadow_what_the_sandbox_needs_are_refused(mount: str, words: str) -> None:
    problem = mount_error(mount, PROTECTED_PATHS)
    assert problem is not None
    assert words in problem


def test_the_python_environment_is_protected_both_ways() -> None:
    env = ["/opt/venv", "/home/ci/project/.venv"]
    assert "hide" in (mount_error("/home/ci", env) or "")  # a parent of the environment
    assert "lies in" in (mount_error("/home/ci/project/.venv/data", env) or "")
    assert mount_error("/home/ci/data", env) is None


def test_the_core_list_covers_every_folder_the_sandbox_binds_or_makes() -> None:
    for path in (*sandbox.SYSTEM_DIRS, "/tmp", "/dev", "/proc", "/sys", sandbox.TRIAL_ROOT):
        assert mount_error(path, PROTECTED_PATHS) is not None, path


def test_repeated_and_nested_mounts_name_the_later_entry() -> None:
    errors = mount_errors(["/data/a", "/data/b", "/data/a", "/data/b/inner", "x"])
    assert paths(errors) == ["data[2].mount", "data[3].mount", "data[4].mount"]
    assert "repeats data[0].mount" in errors[0].message
    assert "overlaps data[1].mount" in errors[1].message


def test_refs_name_a_tenant_or_not() -> None:
    assert split_ref("vision/imagenet-mini") == ("vision", "imagenet-mini")
    assert split_ref("imagenet-mini") == (None, "imagenet-mini")


def test_the_spec_takes_a_data_list_with_optional_versions() -> None:
    spec = parse_spec(
        SPEC + "data:\n  - {name: imagenet-mini, version: 3, mount: /data/imagenet}\n"
        "  - {name: vision/labels, mount: /data/labels}\n"
    )
    assert [(d.name, d.version, d.mount) for d in spec.data] == [
        ("imagenet-mini", 3, "/data/imagenet"),
        ("vision/labels", None, "/data/labels"),
    ]
    assert parse_spec(SPEC).data == []


@pytest.mark.parametrize(
    ("entry", "path"),
    [
        ("{name: a, mount: /d, colour: red}", "data[1].colour"),
        ("{name: 'bad name', mount: /d}", "data[1].name"),
        ("{name: a, version: 0, mount: /d}", "data[1].version"),
        ("{name: a}", "data[1].mount"),
    ],
)
def test_malformed_entries_name_their_field_with_an_index(entry: str, path: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(SPEC + f"data:\n  - {{name: ok, mount: /ok}}\n  - {entry}\n")
    assert [e.path for e in caught.value.errors] == [path]
