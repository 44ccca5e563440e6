"""Ports for servers started later (rank 0's store, the local Ray head, the tests' servers)
come from below the kernel's ephemeral range, where no outgoing connection lands."""

from __future__ import annotations

import socket

import pytest

from trainhub.adapters import free_ports
from trainhub.adapters.free_ports import LOWEST, _ephemeral_start, free_port


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound() -> None:
    ports = {free_port() for _ in range(20)} | {free_port("") for _ in range(5)}
    top = _ephemeral_start()
    if top - LOWEST >= 1_000:
        assert all(LOWEST <= port < top for port in ports), ports
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    top = _ephemeral_start()
    if top - LOWEST < 1_000:
        pytest.skip("this machine's ephemeral range leaves no room below it")
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        # the draw lands on the port held first (as it would with any process listening there)
        draws = iter([taken, taken, LOWEST + 7])
        monkeypatch.setattr(free_ports.random, "randrange", lambda lo, hi: next(draws))
        assert free_ports.free_port("") == LOWEST + 7
