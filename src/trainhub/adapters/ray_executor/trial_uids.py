"""The uid a sandboxed rank runs as: unique per node across every control plane on it.

A rank of trial N used to run as ``SANDBOX_UID_BASE + N``: two control planes on one node
(two homes, two Ray heads, or two namespaces of one cluster) gave their trial 7 the same uid,
and each could read and signal the other's files and processes (issue 24).

Each control plane now gets a block of :data:`UID_BLOCK` uids on a node, recorded in a
node-local registry (a JSON file under ``flock``, mode 0600 in a 0700 folder, root's: only a
root node agent drops to per-trial uids). Its trial N runs as
``SANDBOX_UID_BASE + block * UID_BLOCK + N % UID_BLOCK``. Blocks are handed out in order and
never reused while recorded, so two control planes never share a uid; a control plane keeps
its block across restarts (its identity is its Ray namespace and its storage root). A hash
of the identity would need no file but collides (255 blocks: two of 20 control planes would
share one with a chance of over half); a registry cannot.

Standard library only: imported by Ray workers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

SANDBOX_UID_BASE = 200_000  # as adapters/sandbox.py; below it: the node's own users
UID_BLOCK = 1 << 24  # trial ids of one control plane before its uids repeat (16.7 million)
MAX_UID = 2**32 - 2  # (uid_t)-1 is "no uid"
MAX_BLOCKS = (MAX_UID - SANDBOX_UID_BASE) // UID_BLOCK
ENV_REGISTRY = "TRAINHUB_UID_REGISTRY"  # where the registry file is (tests, odd nodes)
DEFAULT_REGISTRY = Path("/var/lib/trainhub/uid-blocks.json")


class UidBlocksExhausted(RuntimeError):
    """Every block of uids of this node is taken."""


def registry_path() -> Path:
    return Path(os.environ.get(ENV_REGISTRY) or DEFAULT_REGISTRY)


def trial_uid(identity: str, trial_id: int, registry: Path | None = None) -> int:
    """The uid of trial ``trial_id`` of the control plane ``identity`` on this node."""
    block = uid_block(identity, registry or registry_path())
    return SANDBOX_UID_BASE + block * UID_BLOCK + trial_id % UID_BLOCK


def uid_block(identity: str, registry: Path) -> int:
    """The block of ``identity``, handed out now if it has none (under the registry's lock)."""
    with _locked(registry):
        blocks = _read(registry)
        entry = blocks.get(identity)
        if entry is None:
            taken = {int(e["block"]) for e in blocks.values()}
            free = next((b for b in range(MAX_BLOCKS) if b not in taken), None)
            if free is None:
                raise UidBlocksExhausted(
                    f"all {MAX_BLOCKS} uid blocks of this node are taken ({registry}); "
                    "remove the entries of control planes that no longer run"
                )
            entry = {"block": free, "since": time.time()}
            blocks[identity] = entry
            _write(registry, blocks)
        return int(entry["block"])


def _read(registry: Path) -> dict[str, dict[str, float]]:
    try:
        data = json.loads(registry.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(registry: Path, blocks: dict[str, dict[str, float]]) -> None:
    tmp = registry.with_name(f".{registry.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(blocks, out, indent=1, sort_keys=True)
    tmp.replace(registry)


@contextlib.contextmanager
def _locked(registry: Path) -> Iterator[None]:
    registry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(registry.with_name(f".{registry.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
