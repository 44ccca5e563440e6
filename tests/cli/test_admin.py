"""Tenants, users, memberships, tokens: the admin commands against a real server."""

from __future__ import annotations

from tests.cli.conftest import Cli, LiveServer


def test_tenants_create_list_update(cli: Cli) -> None:
    result = cli(
        "tenants", "create", "vision", "--guaranteed", "8", "--limit", "16", "--weight", "2"
    )
    assert result.exit_code == 0, result.output
    assert "created tenant vision: guaranteed 8 slots, limit 16, weight 2" in result.stdout
    listed = cli("tenants", "ls").stdout
    assert "default" in listed
    assert "vision" in listed
    assert "16" in listed
    result = cli("tenants", "update", "vision", "--no-limit", "--weight", "3")
    assert "limit none, weight 3" in result.stdout
    assert "guaranteed 8" in result.stdout
    assert "limit 12" in cli("tenants", "update", "vision", "--limit", "12").stdout
    below = cli("tenants", "update", "vision", "--limit", "4")  # under the guarantee of 8
    assert below.exit_code == 2
    assert "below the guarantee" in below.stderr
    both = cli("tenants", "update", "vision", "--limit", "4", "--no-limit")
    assert both.exit_code == 2
    assert "not both" in both.stderr
    duplicate = cli("tenants", "create", "vision")
    assert duplicate.exit_code == 2
    assert "error:" in duplicate.stderr
    invalid = cli("tenants", "create", "x", "--guaranteed", "-1")
    assert invalid.exit_code == 2  # rejected by the CLI's own option check
    refused = cli("tenants", "update", "vision", "--weight", "0")  # the server's check
    assert refused.exit_code == 2
    assert "--weight: Input should be greater than 0" in refused.stderr  # the option's name


def test_users_and_memberships(cli: Cli) -> None:
    cli("tenants", "create", "vision")
    result = cli("users", "create", "alice")
    assert result.exit_code == 0, result.output
    assert "created user alice" in result.stdout
    assert "created cluster admin root2" in cli("users", "create", "root2", "--admin").stdout
    result = cli("users", "add-to", "vision", "alice", "--role", "viewer")
    assert result.exit_code == 0, result.output
    assert "alice is viewer of vision" in result.stdout
    listed = cli("users", "ls").stdout
    alice = next(line for line in listed.splitlines() if "alice" in line)
    assert "vision (viewer)" in alice
    assert "yes" in next(line for line in listed.splitlines() if "root2" in line)
    assert cli("users", "add-to", "vision", "alice", "--role", "boss").exit_code == 2
    swapped = cli("users", "add-to", "alice", "vision")  # the user named first
    assert swapped.exit_code == 2
    assert "the tenant comes first, then the user" in swapped.stderr
    assert "removed alice from vision" in cli("users", "remove-from", "vision", "alice").stdout
    assert "vision" not in next(
        line for line in cli("users", "ls").stdout.splitlines() if "alice" in line
    )


def test_tokens_create_prints_the_secret_once_and_revoke_stops_it(
    cli: Cli, live: LiveServer
) -> None:
    cli("users", "create", "bob")
    cli("users", "add-to", "default", "bob")
    result = cli("tokens", "create", "--name", "laptop", "--user", "bob", "--ttl-s", "3600")
    assert result.exit_code == 0, result.output
    assert "shown only this once" in result.stdout
    secret = next(line.strip() for line in result.stdout.splitlines() if line.startswith("    th_"))
    whoami = cli("whoami", token=secret)
    assert whoami.exit_code == 0, whoami.output
    assert whoami.stdout.startswith("bob (tenants: default (member))")
    quiet = cli("tokens", "create", "-q").stdout
    assert quiet.strip().startswith("th_")
    assert len(quiet.strip().split()) == 1
    bob_tokens = cli("tokens", "ls", token=secret).stdout
    assert "laptop" in bob_tokens
    assert "active" in bob_tokens
    assert secret not in bob_tokens
    token_id = next(line.split()[0] for line in bob_tokens.splitlines() if "laptop" in line)
    assert f"revoked token {token_id}" in cli("tokens", "revoke", token_id).stdout
    refused = cli("whoami", token=secret)
    assert refused.exit_code == 2
    assert "trainhub login" in refused.stderr


def test_members_cannot_administer(cli: Cli, live: LiveServer) -> None:
    token = live.api.user("carol", "default")
    result = cli("tenants", "create", "mine", token=token)
    assert result.exit_code == 2
    assert "error:" in result.stderr
    assert "Traceback" not in result.output


def test_storage_quotas_are_set_by_admins_and_shown_in_usage(cli: Cli, live: LiveServer) -> None:
    cli("tenants", "create", "vision")
    result = cli(
        "tenants", "update", "vision", "--checkpoint-gb", "2", "--trial-storage-gb", "5",
        "--storage-gb", "100",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "storage: checkpoint 2 GB, trial 5 GB, tenant 100 GB" in result.stdout
    alice = live.api.user("alice", "vision")
    usage = cli("usage", "--days", "1", token=alice)
    assert usage.exit_code == 0, usage.output
    text = usage.stdout.split("storage (checkpoints kept now) and quotas", 1)[1]
    line = next(line for line in text.splitlines() if line.strip().startswith("vision"))
    cells = [c.strip() for c in line.split("│")]
    assert cells == ["vision", "0 B", "100 GB", "0.0%", "5 GB", "2 GB"]
    back = cli("tenants", "update", "vision", "--default-storage")
    assert "tenant 1.1 TB" in back.stdout  # a human unit, not "1,099.51 GB"
    # members cannot change quotas
    refused = cli("tenants", "update", "vision", "--storage-gb", "1000", token=alice)
    assert refused.exit_code == 2
