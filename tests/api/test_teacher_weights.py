"""``GET /trials/{id}/teacher-weights``: a student trial reads its teacher, and nothing else.

The teacher is a trial of the same tenant (``trial:ID``) or a registered model the tenant owns
or is shared (``NAME[:VERSION]``), checked and pinned at submit by the model registry, as
``model.init_from`` is."""

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
        (f"trial:{secret}", "does not exist in tenant 'vision'"),
        ("trial:999", "does not exist in tenant 'vision'"),
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


def test_a_registered_teacher_is_pinned_at_submit_and_fetched_by_the_students_runtime(
    served: Served,
) -> None:
    api = served.api
    alice = api.user("alice", "vision")
    vadmin = api.user("vera", "vision", "admin")
    bob = api.user("bob", "speech")
    source = submit(api, alice).json()["trials"][0]["id"]
    checkpoint(api, source, start_attempt(api, source), 3, b"teacher weights v1")
    r = api.client.post(
        "/api/v1/models", json={"trial_id": source, "name": "teach"}, headers=api.headers(alice)
    )
    assert r.status_code == 201, r.text
    # a name is pinned to its latest version in the stored spec, as model.init_from is
    r = submit(api, alice, spec("teach"))
    assert r.status_code == 201, r.text
    detail = api.client.get(
        f"/api/v1/experiments/{r.json()['id']}", headers=api.headers(alice)
    ).json()
    assert detail["spec"]["distill"]["teacher"] == "vision/teach:1"
    student = r.json()["trials"][0]["id"]
    headers = start_attempt(api, student)
    token = headers["Authorization"].split()[1]
    fetched = fetch_teacher_weights(served.url, token, student, parse_teacher("vision/teach:1"))
    assert fetched == b"teacher weights v1"
    # another tenant cannot distil from a model not shared with it, in any spelling
    for teacher, message in (
        ("teach", "does not exist"),
        ("vision/teach:1", "is not shared with tenant 'speech'"),
        ("teach:7", "does not exist"),
    ):
        r = submit(api, bob, spec(teacher))
        assert r.status_code == 422, (teacher, r.text)
        (error,) = r.json()["errors"]
        assert error["path"] == "distill.teacher"
        assert message in error["message"], error
    r = submit(api, alice, spec("teach:7"))
    assert r.status_code == 422
    assert "no version 7" in r.json()["errors"][0]["message"]
    # shared by a tenant admin: speech distils from it; unshared: the next fetch is refused
    r = api.client.put("/api/v1/models/teach/shares/speech", headers=api.headers(vadmin))
    assert r.status_code == 200, r.text
    r = submit(api, bob, spec("vision/teach"))
    assert r.status_code == 201, r.text
    theirs = r.json()["trials"][0]["id"]
    their_headers = start_attempt(api, theirs)
    r = api.client.get(f"/api/v1/trials/{theirs}/teacher-weights", headers=their_headers)
    assert r.status_code == 200, r.text
    assert r.content == b"teacher weights v1"
    # the student's token reads its teacher, not another trial's
    r = api.client.get(f"/api/v1/trials/{theirs}/teacher-weights", headers=headers)
    assert r.status_code == 404
    api.client.delete("/api/v1/models/teach/shares/speech", headers=api.headers(vadmin))
    r = api.client.get(f"/api/v1/trials/{theirs}/teacher-weights", headers=their_headers)
    assert r.status_code == 404
    assert "is not shared with tenant 'speech'" in r.json()["message"]
