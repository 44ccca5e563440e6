"""The trial's rendezvous store keeps its keys under the attempt's secret: a process of another
trial that reaches its port cannot read or write them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.fixtures.ports import free_port

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from trainhub.core.isolation import RENDEZVOUS_SECRET_ENV as CORE_NAME  # noqa: E402
from trainhub.runtime.process_group import (  # noqa: E402
    RENDEZVOUS_SECRET_ENV,
    rendezvous_store,
)


def test_the_runtime_and_the_executor_name_the_secret_alike() -> None:
    assert RENDEZVOUS_SECRET_ENV == CORE_NAME


def test_keys_are_out_of_reach_without_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    master = rendezvous_store(0, 2, "s3cret")
    master.set("rank0/address", "10.0.0.1:1234")
    member = rendezvous_store(1, 2, "s3cret")
    assert member.get("rank0/address") == b"10.0.0.1:1234"

    intruder = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=5))
    assert not intruder.check(["rank0/address"])
    wrong = dist.PrefixStore("trainhub/guess/", intruder)
    assert not wrong.check(["rank0/address"])
    intruder.set("rank0/address", "attacker")
    assert member.get("rank0/address") == b"10.0.0.1:1234"
