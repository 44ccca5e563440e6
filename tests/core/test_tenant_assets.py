"""The rules models and datasets share: who sees an asset, which one a name means, versions,
shares (trainhub.core.tenant_assets)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trainhub.core.errors import InvalidRequest, NotFound
from trainhub.core.tenant_assets import (
    pick,
    pick_version,
    share_refusal,
    shares_seen,
    visible_to,
)


@dataclass(frozen=True)
class Item:
    name: str
    tenant: str
    shared_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class Numbered:
    version: int


MISSING = ("thing base does not exist", "see `trainhub things ls`")


def test_an_asset_is_seen_by_its_tenant_those_it_is_shared_with_and_admins() -> None:
    base = Item("base", "vision", ("nlp",))
    assert visible_to(base, ["vision"])
    assert visible_to(base, ["speech", "nlp"])
    assert not visible_to(base, ["speech"])
    assert visible_to(base, None)  # a cluster admin
    assert shares_seen(base, False, ["vision"]) == ("nlp",)
    assert shares_seen(Item("b", "vision", ("nlp", "speech")), False, ["nlp"]) == ("nlp",)
    assert shares_seen(Item("b", "vision", ("nlp", "speech")), True, []) == ("nlp", "speech")


def test_a_name_means_the_readers_own_asset_first_then_one_shared_with_them() -> None:
    own, theirs = Item("base", "vision"), Item("base", "speech", ("vision",))
    assert pick([theirs, own], ["vision"], "thing", MISSING) is own
    assert pick([theirs], ["vision"], "thing", MISSING) is theirs
    with pytest.raises(NotFound) as missing:
        pick([theirs], ["nlp"], "thing", MISSING)  # not shared with nlp: it does not exist
    assert (missing.value.message, missing.value.hint) == MISSING
    with pytest.raises(InvalidRequest) as several:
        pick([theirs, Item("base", "nlp")], None, "thing", MISSING)
    assert several.value.message == "several things are called 'base' (tenants nlp, speech)"
    assert several.value.hint == "name it TENANT/base"


def test_a_version_number_or_the_latest() -> None:
    versions = [Numbered(1), Numbered(3)]
    assert pick_version(versions, "thing", "base", None).version == 3
    assert pick_version(versions, "thing", "base", 1).version == 1
    with pytest.raises(NotFound) as absent:
        pick_version(versions, "thing", "base", 2)
    assert (absent.value.message, absent.value.hint) == (
        "thing base has no version 2",
        "its versions: 1, 3",
    )
    with pytest.raises(NotFound, match=r"thing base has no version$"):
        pick_version([], "thing", "base", None)


def test_a_share_with_its_own_tenant_or_past_the_limit_is_refused() -> None:
    base = Item("base", "vision", ("nlp",))
    own = share_refusal("thing", "base", base, "vision", True, 8)
    assert own is not None
    assert own.message == "thing base already belongs to tenant 'vision'"
    full = share_refusal("thing", "base", base, "speech", True, 1)
    assert full is not None
    assert full.message == "thing base is shared with 1 tenants; the limit is 1"
    assert share_refusal("thing", "base", base, "nlp", False, 1) is None  # stopping is fine
    assert share_refusal("thing", "base", base, "speech", True, 8) is None
