"""``GET /trials/{id}/teacher-weights``: a student trial reads its teacher, and nothing else."""

from __future__ import annotations

from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api


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


def test_a_teacher_of_another_tenant_is_not_served(bapi: Api) -> None:
    bob = bapi.user("bob", "speech")
    secret = submit(bapi, bob).json()["trials"][0]["id"]
    checkpoint(bapi, secret, start_attempt(bapi, secret), 1, b"bob's weights")
    alice = bapi.user("alice", "vision")
    student = submit(bapi, alice, spec(f"trial:{secret}")).json()["trials"][0]["id"]
    r = bapi.client.get(
        f"/api/v1/trials/{student}/teacher-weights", headers=start_attempt(bapi, student)
    )
    assert r.status_code == 404
    assert "does not exist in this tenant" in r.text
    assert "bob" not in r.text


def test_a_trial_without_distill_or_checkpoint_says_so(bapi: Api) -> None:
    alice = bapi.user("alice", "vision")
    plain = submit(bapi, alice).json()["trials"][0]["id"]
    r = bapi.client.get(
        f"/api/v1/trials/{plain}/teacher-weights", headers=start_attempt(bapi, plain)
    )
    assert r.status_code == 404
    assert "no distill section" in r.text
    student = submit(bapi, alice, spec(f"trial:{plain}")).json()["trials"][0]["id"]
    r = bapi.client.get(
        f"/api/v1/trials/{student}/teacher-weights", headers=start_attempt(bapi, student)
    )
    assert r.status_code == 404
    assert "has no checkpoint yet" in r.text
