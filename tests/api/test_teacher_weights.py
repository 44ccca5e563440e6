"""``GET /trials/{id}/teacher-weights``: a student trial reads its teacher, and nothing else."""

from __future__ import annotations

import pytest

from tests.api.conftest import Served
from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api
from trainhub.distill_contract import parse_teacher
from trainhub.runtime.distill import TeacherError, fetch_teacher_weights


def spec(teacher: str) -> str:
    return f"name: student\nentrypoint: python train.py\ndistill: {{teacher: '{teacher}'}}\n"


def checkpoint(api: Api, trial_id: int, headers: dict[str, str], step: int, data: bytes) -> None:
    r = api.client.post(
        f"/api/v1/trials/{trial_id}/checkpoints",
        params={"uuid": f"c{trial_id}-{step}", "step": step},
        content=data,
        headers=headers,
    )
    assert r.status_code == 201, r.text


def test_a_student_reads_the_latest_checkpoint_of_its_teacher_trial(bapi: Api) -> None:
    alice = bapi.user("alice", "vision")
    teacher = submit(bapi, alice).json()["trials"][0]["id"]
    own = start_attempt(bapi, teacher)
    checkpoint(bapi, teacher, own, 1, b"early")
    checkpoint(bapi, teacher, own, 5, b"latest")
    student = submit(bapi, alice, spec(f"trial:{teacher}")).json()["trials"][0]["id"]
    headers = start_attempt(bapi, student)
    r = bapi.client.get(f"/api/v1/trials/{student}/teacher-weights", headers=headers)
    assert r.status_code == 200, r.text
    assert r.content == b"latest"
    # the student's token still cannot read the teacher trial itself
    r = bapi.client.get(f"/api/v1/trials/{teacher}/checkpoints", headers=headers)
    assert r.status_code == 404


def test_a_teacher_that_cannot_be_had_is_refused_at_submit_with_its_field(bapi: Api) -> None:
    bob = bapi.user("bob", "speech")
    secret = submit(bapi, bob).json()["trials"][0]["id"]
    checkpoint(bapi, secret, start_attempt(bapi, secret), 1, b"bob's weights")
    alice = bapi.user("alice", "vision")
    unsaved = submit(bapi, alice).json()["trials"][0]["id"]
    for teacher, message in (
        (f"trial:{secret}", "does not exist in this tenant"),
        ("trial:999", "does not exist in this tenant"),
        (f"trial:{unsaved}", "has no checkpoint yet"),
    ):
        r = submit(bapi, alice, spec(teacher))
        assert r.status_code == 422, r.text
        (error,) = r.json()["errors"]
        assert error["path"] == "distill.teacher"
        assert message in error["message"]


def test_a_trial_without_distill_gets_no_teacher_and_its_runtime_says_so(
    served: Served,
) -> None:
    api = served.api
    alice = api.user("alice", "vision")
    plain = submit(api, alice).json()["trials"][0]["id"]
    headers = start_attempt(api, plain)
    r = api.client.get(f"/api/v1/trials/{plain}/teacher-weights", headers=headers)
    assert r.status_code == 404
    assert "no distill section" in r.text
    token = headers["Authorization"].split()[1]
    ref = parse_teacher("trial:1")
    with pytest.raises(TeacherError, match=r"may not read it \(trial \d+ distils from no teacher"):
        fetch_teacher_weights(served.url, token, plain, ref)
