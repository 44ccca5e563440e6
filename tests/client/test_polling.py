"""The polling pace on a fake clock: one round at once, the interval between rounds, the deadline.

The client's follow and wait loops are driven through a mock transport with the same fake
sleep, so none of these tests waits.
"""

from __future__ import annotations

import httpx
import pytest

from trainhub.client import JSON, TrainhubClient, polls


class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_first_round_comes_at_once_and_breaking_out_never_waits() -> None:
    clock = FakeClock()
    rounds = []
    for number in polls(2.0, sleep=clock.sleep, clock=clock):
        rounds.append(number)
        if number == 2:  # done
            break
    assert rounds == [0, 1, 2]
    assert clock.sleeps == [2.0, 2.0]  # between rounds only, none after the last


def test_rounds_stop_once_a_round_ends_past_the_deadline() -> None:
    clock = FakeClock()
    rounds = list(polls(2.0, timeout_s=5.0, sleep=clock.sleep, clock=clock))
    # rounds end at 100, 102, 104, 106; the one ending at 106 is past 105
    assert rounds == [0, 1, 2, 3]
    assert clock.sleeps == [2.0, 2.0, 2.0]


def test_a_slow_round_counts_towards_the_deadline() -> None:
    clock = FakeClock()
    rounds = []
    for number in polls(1.0, timeout_s=3.0, sleep=clock.sleep, clock=clock):
        rounds.append(number)
        clock.now += 10.0  # the server took 10 s to answer
    assert rounds == [0]
    assert clock.sleeps == []


def _scripted_trials(states: list[str]) -> httpx.MockTransport:
    """A server whose trial 7 goes through ``states``, one per GET (then stays in the last)."""
    pending = list(states)

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/trials/7"
        state = pending.pop(0) if len(pending) > 1 else pending[0]
        return httpx.Response(200, json={"id": 7, "state": state, "attempts": []})

    return httpx.MockTransport(answer)


def test_watch_trial_yields_each_poll_up_to_the_end() -> None:
    clock = FakeClock()
    transport = _scripted_trials(["QUEUED", "RUNNING", "COMPLETED"])
    with TrainhubClient(transport=transport) as client:
        states = [t["state"] for t in client.watch_trial(7, 0.5, sleep=clock.sleep)]
    assert states == ["QUEUED", "RUNNING", "COMPLETED"]
    assert clock.sleeps == [0.5, 0.5]


def test_wait_for_trial_gives_up_at_its_timeout() -> None:
    clock = FakeClock()
    with (
        TrainhubClient(transport=_scripted_trials(["RUNNING"])) as client,
        pytest.raises(TimeoutError, match="trial 7 is still RUNNING"),
    ):
        client.wait_for_trial(7, 2.0, timeout_s=3.0, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == [2.0, 2.0]


def test_following_logs_waits_only_when_there_is_nothing_new() -> None:
    def logs(attempt: int, offset: int, next_offset: int, complete: bool, text: str = "") -> JSON:
        return {
            "attempt": attempt,
            "offset": offset,
            "next_offset": next_offset,
            "text": text,
            "complete": complete,
        }

    running = {"state": "RUNNING", "attempts": [{"number": 1}, {"number": 2}]}
    script = [  # (path, query the client sends besides rank and limit, the server's answer)
        ("/logs", {"offset": "0"}, logs(1, 0, 6, False, "hello\n")),
        ("/logs", {"attempt": "1", "offset": "6"}, logs(1, 6, 6, False)),  # nothing new: wait
        ("/logs", {"attempt": "1", "offset": "6"}, logs(1, 6, 6, True)),  # ended, restarted
        ("", {}, running),
        ("/logs", {"attempt": "2", "offset": "0"}, logs(2, 0, 4, False, "bye\n")),
        ("/logs", {"attempt": "2", "offset": "4"}, logs(2, 4, 4, True)),
        ("", {}, {**running, "state": "COMPLETED"}),
    ]

    def answer(request: httpx.Request) -> httpx.Response:
        path, query, body = script.pop(0)
        assert request.url.path == "/api/v1/trials/7" + path
        sent = {k: v for k, v in request.url.params.items() if k not in ("rank", "limit")}
        assert sent == query
        return httpx.Response(200, json=body)

    clock = FakeClock()
    with TrainhubClient(transport=httpx.MockTransport(answer)) as client:
        chunks = list(client.iter_logs(7, follow=True, poll_interval_s=1.5, sleep=clock.sleep))
    assert [c["text"] for c in chunks] == ["hello\n", "bye\n"]
    assert script == []
    assert clock.sleeps == [1.5]  # once, when the attempt was still writing; not on the restart
