"""The collector is paused inside ``collection_paused`` and restored after, nested or not."""

from __future__ import annotations

import gc

import pytest

from trainhub.core.gcpause import collection_paused


@pytest.fixture(autouse=True)
def _collector_on() -> object:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_and_on_again_after_even_when_the_block_raises() -> None:
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("decision failed")
    assert gc.isenabled()


def test_an_inner_block_leaves_an_outer_pause_in_place() -> None:
    with collection_paused():
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with collection_paused():
        pass
    assert not gc.isenabled()
