"""A script launched by the control plane: the runtime against a real HTTP peer."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import trainhub
from tests.runtime.fake_control_plane import FakeControlPlane
from trainhub.runtime import RuntimeOptions

FAST = RuntimeOptions(
    metrics_batch_s=0.1, signals_poll_s=0.1, retry_initial_s=0.05, retry_max_s=0.2
)


def _eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


# --- metrics ---


def test_points_are_batched(managed_env: FakeControlPlane) -> None:
    ctx = trainhub.init(options=FAST.replace(metrics_batch_s=5.0, metrics_batch_max_points=10))
    for step in range(25):
        ctx.report(step=step, loss=1.0 / (step + 1))
    assert ctx.close(timeout_s=10)

    batches = managed_env.metric_batches
    assert [len(batch["points"]) for batch in batches] == [10, 10, 5]
    assert all(batch["attempt"] == 1 for batch in batches)
    assert [p["step"] for p in managed_env.points()] == list(range(25))
    assert managed_env.values_by_step()[3] == {"loss": 0.25}


def test_a_point_waits_at_most_the_batch_interval(managed_env: FakeControlPlane) -> None:
    ctx = trainhub.init(options=FAST.replace(metrics_batch_s=0.2))
    ctx.report(step=1, loss=0.5)
    _eventually(lambda: len(managed_env.points()) == 1, timeout_s=3)
    assert managed_env.points()[0]["values"] == {"loss": 0.5}
    ctx.report(step=2, loss=0.4)
    ctx.report(step=3, loss=0.3)
    _eventually(lambda: len(managed_env.points()) == 3, timeout_s=3)
    assert len(managed_env.metric_batches) == 2  # the two later points travelled together


def test_nothing_is_lost_while_the_control_plane_is_down(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plane = FakeControlPlane()  # not started: connections are refused
    for name, value in plane.env(TRAINHUB_SPOOL_DIR=str(tmp_path / "spool")).items():
        monkeypatch.setenv(name, value)
    ctx = trainhub.init(options=FAST)
    for step in range(15):
        ctx.report(step=step, loss=float(step))
    ctx.set_progress(15, total=30)
    time.sleep(0.5)  # several failed tries
    plane.start()
    try:
        for step in range(15, 30):
            ctx.report(step=step, loss=float(step))
        assert ctx.close(timeout_s=10)
    finally:
        plane.stop()

    steps = [point["step"] for point in plane.points()]
    assert steps == list(range(30))  # each once, in order
    assert plane.metric_batches[0]["progress"] == {"current": 15.0, "total": 30.0, "unit": "epochs"}


def test_server_errors_and_throttling_are_retried(managed_env: FakeControlPlane) -> None:
    managed_env.fail("metrics", 503, 500, 429, 408)
    ctx = trainhub.init(options=FAST)
    ctx.report(step=1, loss=0.5)
    assert ctx.close(timeout_s=10)
    assert managed_env.values_by_step() == {1: {"loss": 0.5}}


def test_a_refused_batch_is_dropped_and_later_points_still_arrive(
    managed_env: FakeControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    managed_env.fail("metrics", 400)
    ctx = trainhub.init(options=FAST)
    ctx.report(step=1, loss=0.5)
    assert ctx.flush(timeout_s=5)
    ctx.report(step=2, loss=0.4)
    ctx.close(timeout_s=5)

    assert managed_env.values_by_step() == {2: {"loss": 0.4}}
    assert "refused 1 metric points" in capsys.readouterr().err


def test_close_gives_up_after_the_flush_timeout_and_keeps_the_points(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plane = FakeControlPlane()  # never started
    for name, value in plane.env(TRAINHUB_SPOOL_DIR=str(tmp_path / "spool")).items():
        monkeypatch.setenv(name, value)
    ctx = trainhub.init(options=FAST)
    ctx.report(step=1, loss=0.5)
    started = time.monotonic()

    assert ctx.close(timeout_s=0.5) is False

    assert time.monotonic() - started < 3
    spilled = (tmp_path / "spool" / "undelivered-metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["values"] for line in spilled] == [{"loss": 0.5}]


def test_progress_travels_even_without_points(managed_env: FakeControlPlane) -> None:
    ctx = trainhub.init(options=FAST)
    ctx.set_progress(3, total=10, unit="steps")
    assert ctx.close(timeout_s=5)
    assert managed_env.metric_batches == [
        {"attempt": 1, "points": [], "progress": {"current": 3.0, "total": 10.0, "unit": "steps"}}
    ]


def test_non_finite_values_are_not_sent(managed_env: FakeControlPlane) -> None:
    ctx = trainhub.init(options=FAST)
    ctx.report(step=1, loss=float("nan"), accuracy=0.5)
    assert ctx.close(timeout_s=5)
    assert managed_env.values_by_step() == {1: {"accuracy": 0.5}}


# --- checkpoints ---


def _load(data: bytes) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(io.BytesIO(data), weights_only=True)
    return state


def test_checkpoint_is_uploaded_and_registered(managed_env: FakeControlPlane) -> None:
    ctx = trainhub.init(options=FAST)
    handle = ctx.save_checkpoint({"w": torch.arange(3.0)}, step=4, metrics={"acc": 0.9})

    assert handle is not None
    assert handle.wait(timeout_s=5)
    [stored] = managed_env.checkpoints.values()
    assert (handle.id, handle.uuid) == (stored.id, stored.uuid)
    assert (stored.step, stored.attempt, stored.metrics) == (4, 1, {"acc": 0.9})
    assert torch.equal(_load(stored.data)["w"], torch.arange(3.0))
    assert not handle.path.exists()  # the spool copy goes once uploaded


def test_the_metrics_reported_before_a_checkpoint_land_before_it_is_registered(
    managed_env: FakeControlPlane,
) -> None:
    # a node that dies right after a checkpoint is registered must not take the metrics of
    # the steps before it along: the resumed trial starts after the checkpoint's step and
    # never reports them again (tests/distributed/test_no_shared_folder.py)
    ctx = trainhub.init(options=FAST.replace(metrics_batch_s=60.0))
    for step in range(4):
        ctx.report(step=step, loss=1.0 / (step + 1))
    handle = ctx.save_checkpoint({"w": torch.zeros(2)}, step=3)
    assert handle is not None
    assert handle.wait(timeout_s=10)
    assert [p["step"] for p in managed_env.points()] == [0, 1, 2, 3]  # not 60 s later
    assert ctx.close(timeout_s=10)


def test_an_upload_retried_after_a_lost_answer_registers_one_checkpoint(
    managed_env: FakeControlPlane,
) -> None:
    managed_env.lose_next_checkpoint_answers = 1
    managed_env.fail("checkpoints", 502)
    ctx = trainhub.init(options=FAST)
    handle = ctx.save_checkpoint({"w": torch.ones(1)}, step=1)

    assert handle is not None
    assert handle.wait(timeout_s=5)
    assert len(managed_env.checkpoints) == 1
    assert managed_env.checkpoint_posts == [handle.uuid, handle.uuid]  # 502 is not recorded
    assert handle.id == managed_env.checkpoints[handle.uuid].id


def test_an_upload_pending_during_an_outage_is_finished_by_close(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plane = FakeControlPlane()
    for name, value in plane.env(TRAINHUB_SPOOL_DIR=str(tmp_path / "spool")).items():
        monkeypatch.setenv(name, value)
    ctx = trainhub.init(options=FAST)
    handle = ctx.save_checkpoint({"w": torch.ones(1)}, step=1)
    time.sleep(0.3)
    assert handle is not None
    assert not handle.done
    plane.start()
    try:
        assert ctx.close(timeout_s=10)
    finally:
        plane.stop()
    assert handle.done
    assert [c.step for c in plane.checkpoints.values()] == [1]


def test_restore_downloads_the_checkpoint_the_executor_named(
    managed_env: FakeControlPlane, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    buffer = io.BytesIO()
    torch.save({"epoch": 3, "w": torch.ones(2)}, buffer)
    managed_env.add_checkpoint(b"not this one")
    checkpoint_id = managed_env.add_checkpoint(buffer.getvalue(), step=3)
    monkeypatch.setenv("TRAINHUB_RESTORE_CHECKPOINT", str(checkpoint_id))
    managed_env.fail("file", 503)  # the control plane is restarting

    ctx = trainhub.init(options=FAST)
    state = ctx.restore()

    assert state is not None
    assert state["epoch"] == 3
    assert torch.equal(state["w"], torch.ones(2))
    assert (tmp_path / "spool" / "restore" / f"checkpoint-{checkpoint_id}.pt").exists()


def test_restore_without_a_named_checkpoint_starts_fresh(managed_env: FakeControlPlane) -> None:
    torch.save({"epoch": 9}, "step-9.pt")  # local files do not count when managed
    assert trainhub.init(options=FAST, checkpoint_dir=".").restore() is None


def test_restore_of_an_unknown_checkpoint_says_so(
    managed_env: FakeControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHUB_RESTORE_CHECKPOINT", "99")
    ctx = trainhub.init(options=FAST)
    with pytest.raises(RuntimeError, match=r"cannot restore checkpoint 99.*HTTP 404"):
        ctx.restore()


# --- signals ---


def test_should_stop_follows_the_control_plane_signal(managed_env: FakeControlPlane) -> None:
    ctx = trainhub.init(options=FAST)
    assert ctx.should_stop() is False

    with managed_env.lock:
        managed_env.signals = {"should_stop": True, "reason": "preempted"}
    _eventually(ctx.should_stop)

    assert ctx.stop_reason == "preempted"
    with managed_env.lock:
        managed_env.signals = {"should_stop": False, "reason": None}
    assert ctx.should_stop() is True  # a stop is final


def test_should_stop_reads_a_cached_answer(managed_env: FakeControlPlane) -> None:
    ctx = trainhub.init(options=FAST.replace(signals_poll_s=10.0))
    for _ in range(200):
        ctx.should_stop()
    assert managed_env.signal_gets == 1


def test_a_stop_on_the_reply_to_a_report_of_the_searcher_metric_is_seen_at_once(
    managed_env: FakeControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the heartbeat is far away and batches wait long: only the reply can bring the stop
    monkeypatch.setenv("TRAINHUB_SEARCHER_METRIC", "val_accuracy")
    ctx = trainhub.init(options=FAST.replace(signals_poll_s=60.0, metrics_batch_s=60.0))
    assert ctx.should_stop() is False
    ctx.report(step=0, train_loss=0.9)  # not the searcher's metric: no wait
    assert ctx.should_stop() is False
    assert managed_env.metric_batches == []
    with managed_env.lock:
        managed_env.signals = {"should_stop": True, "reason": "pruned by the asha pruner"}
    ctx.report(step=1, val_accuracy=0.5)
    assert ctx.should_stop() is True  # the report went out and its reply said stop
    assert ctx.stop_reason == "pruned by the asha pruner"
    assert [p["step"] for p in managed_env.points()] == [0, 1]
    assert managed_env.signal_gets == 1  # the first check only; the stop came on the reply


def test_should_stop_waits_for_a_reply_once_while_the_control_plane_is_away(
    managed_env: FakeControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHUB_SEARCHER_METRIC", "val_accuracy")
    ctx = trainhub.init(options=FAST.replace(signals_poll_s=60.0, stop_check_timeout_s=1.0))
    assert ctx.should_stop() is False
    managed_env.stop()
    waits = []
    for step in range(3):
        ctx.report(step=step, val_accuracy=0.5)
        began = time.monotonic()
        assert ctx.should_stop() is False
        waits.append(time.monotonic() - began)
    assert waits[0] >= 0.9  # it waited for the reply, up to the timeout
    assert max(waits[1:]) < 0.5  # then training does not wait on an absent control plane
    managed_env.start()
    assert ctx.flush(timeout_s=20)  # back: the sender delivers what waited
    with managed_env.lock:
        managed_env.signals = {"should_stop": True, "reason": "pruned"}
    ctx.report(step=3, val_accuracy=0.1)
    assert ctx.should_stop() is True  # and should_stop() waits for replies again
    assert [p["step"] for p in managed_env.points()] == [0, 1, 2, 3]


def test_a_stop_rides_on_any_metrics_reply(managed_env: FakeControlPlane) -> None:
    ctx = trainhub.init(options=FAST.replace(signals_poll_s=60.0))
    assert ctx.should_stop() is False
    with managed_env.lock:
        managed_env.signals = {"should_stop": True, "reason": "preempted"}
    ctx.report(step=1, loss=0.5)
    assert ctx.flush(timeout_s=5)
    assert ctx.should_stop() is True
    assert managed_env.signal_gets == 1


def test_a_wrong_token_is_not_retried(
    managed_env: FakeControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHUB_TOKEN", "stale")
    ctx = trainhub.init(options=FAST)
    ctx.report(step=1, loss=0.5)
    started = time.monotonic()
    ctx.close(timeout_s=30)
    assert time.monotonic() - started < 5
    assert managed_env.points() == []


def test_metrics_the_control_plane_would_refuse_fail_at_report(
    managed_env: FakeControlPlane,
) -> None:
    ctx = trainhub.init(options=FAST)
    with pytest.raises(TypeError, match="bool"):
        ctx.report(step=1, converged=True)
    with pytest.raises(ValueError, match="1-128"):
        ctx.report(step=1, **{"x" * 129: 1.0})
    with pytest.raises(ValueError, match="at most 256"):
        ctx.report(step=1, **{f"m{i}": 1.0 for i in range(257)})
    ctx.report(step=1, loss=0.5)
    assert ctx.close(timeout_s=10)
    assert managed_env.values_by_step() == {1: {"loss": 0.5}}


def test_the_wire_bounds_match_the_control_planes() -> None:
    from trainhub.core import limits
    from trainhub.runtime import protocol

    assert protocol.METRIC_NAME_PATTERN == limits.METRIC_NAME_PATTERN
    assert protocol.MAX_METRICS_PER_POINT == limits.MAX_METRICS_PER_POINT
    assert protocol.MAX_POINTS_PER_REQUEST == limits.MAX_POINTS_PER_REQUEST
    assert protocol.MAX_METRICS_BODY_BYTES == limits.MAX_METRICS_BODY_BYTES


def test_batches_stay_under_the_body_bound(managed_env: FakeControlPlane) -> None:
    from trainhub.runtime import protocol

    ctx = trainhub.init(options=FAST.replace(metrics_batch_s=5.0, metrics_batch_max_points=100))
    wide = {f"{'m' * 120}_{i:03d}": float(i) for i in range(256)}  # ~40 KB of JSON a point
    for step in range(100):
        ctx.report(step=step, **wide)
    assert ctx.close(timeout_s=30)
    sizes = [len(json.dumps(b, separators=(",", ":"))) for b in managed_env.metric_batches]
    assert len(sizes) >= 4
    assert max(sizes) <= protocol.MAX_METRICS_BODY_BYTES
    assert [p["step"] for p in managed_env.points()] == list(range(100))
