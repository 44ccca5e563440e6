"""What a rank's node does for the spec's ``data`` list before the rank starts: ask the control
plane which versions the trial mounts (with the trial's own token, so the check is made again
now), make each one present in the node's cache (adapters/dataset_cache.py), and say where it
goes in the sandbox.

Standard library only: imported inside Ray worker processes.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainhub.adapters.dataset_cache import Acquired, DatasetCache, DatasetFetchError

DATASETS_ENV = "TRAINHUB_DATASETS"  # the spec's data list, pinned (set by the control loop)
MOUNTS_ENV = "TRAINHUB_DATA_MOUNTS"  # {mount: folder} where a rank runs without a sandbox
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PreparedMount:
    ref: str
    mount: str
    held: Acquired


def _get(url: str, token: str, timeout_s: float = 60.0) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    return urllib.request.urlopen(request, timeout=timeout_s)


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read() or b"{}")
        return str(body.get("message") or exc)
    except ValueError:
        return str(exc)


def prepare_datasets(
    env: Mapping[str, str], trial_id: int, cache: DatasetCache
) -> list[PreparedMount]:
    """Every dataset of the trial present in ``cache`` and held; [] when it mounts none."""
    if not env.get(DATASETS_ENV):
        return []
    api = env.get("TRAINHUB_API_URL", "").rstrip("/") + "/api/v1"
    token = env.get("TRAINHUB_TOKEN", "")
    try:
        with _get(f"{api}/trials/{trial_id}/datasets", token) as response:
            listed = json.loads(response.read())["data"]
    except urllib.error.HTTPError as exc:
        raise DatasetFetchError(
            f"the control plane refused the datasets: {_error_text(exc)}"
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DatasetFetchError(f"cannot reach the control plane at {api}: {exc}") from exc
    prepared: list[PreparedMount] = []
    try:
        for item in listed:
            url = f"{api}/trials/{trial_id}/datasets/{item['index']}/archive"

            def fetch(out: BinaryIO, url: str = url, item: dict[str, Any] = item) -> None:
                _download(url, token, item["sha256"], item["ref"], out)

            held = cache.acquire(item["sha256"], int(item["size_bytes"]), fetch)
            prepared.append(PreparedMount(item["ref"], item["mount"], held))
    except BaseException:
        for mount in prepared:
            cache.release(mount.held)
        raise
    return prepared


def _download(url: str, token: str, sha256: str, ref: str, out: BinaryIO) -> None:
    digest = hashlib.sha256()
    try:
        with _get(url, token, timeout_s=300.0) as response:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise DatasetFetchError(f"dataset {ref}: {_error_text(exc)}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DatasetFetchError(f"dataset {ref} could not be downloaded: {exc}") from exc
    if digest.hexdigest() != sha256:
        raise DatasetFetchError(f"dataset {ref} arrived corrupted (its SHA-256 differs)")


def host_mounts(prepared: list[PreparedMount]) -> dict[str, str]:
    """{mount path: cached folder}, for a rank that runs without a sandbox."""
    return {m.mount: str(m.held.path) for m in prepared}


def describe(prepared: list[PreparedMount]) -> list[str]:
    """One log line per dataset: where, and whether it was copied to the node."""
    lines = []
    for m in prepared:
        how = (
            f"fetched {m.held.copied_bytes} bytes"
            if m.held.copied_bytes
            else "node cache hit, copied nothing"
        )
        lines.append(f"dataset {m.ref} at {m.mount}: {how}, ready in {m.held.ready_s:.3f} s")
    return lines


def cache_root(node_work_root: Path) -> Path:
    return node_work_root / "datasets"
