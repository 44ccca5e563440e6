"""Where the connection comes from: the arguments, the environment, the saved login, a default.

``trainhub login`` saves a URL and a token to ``$XDG_CONFIG_HOME/trainhub/credentials.json``
(by default under ``~/.config``), readable by the user alone. :func:`resolve_connection` picks,
first match wins, the arguments, then ``TRAINHUB_URL``/``TRAINHUB_TOKEN``, then that file,
then ``http://127.0.0.1:8080``. A saved token is only sent to the URL it was saved for, so
pointing ``TRAINHUB_URL`` at another server never leaks it.

Nothing here speaks HTTP: the CLI's ``login``/``whoami`` and the client share these functions.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class Connection:
    """A server URL, a token for it, and where each came from (for ``trainhub whoami``)."""

    url: str
    token: str | None
    url_source: str
    token_source: str | None


def credentials_path() -> Path:
    """The file ``trainhub login`` writes: ``$XDG_CONFIG_HOME/trainhub/credentials.json``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "trainhub" / "credentials.json"


def normalize_url(url: str) -> str:
    """``localhost:8080`` -> ``http://localhost:8080``; no trailing slash."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def save_credentials(url: str, token: str, path: Path | None = None) -> Path:
    """Save a URL and token to a file only the current user can read (mode 0600).

    Args:
        url: the server URL.
        token: the API token.
        path: where to write; default :func:`credentials_path`.

    Returns:
        The path written.
    """
    path = path or credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"url": normalize_url(url), "token": token}, handle)
        handle.write("\n")
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a file that already existed
    os.replace(tmp, path)
    return path


def load_credentials(path: Path | None = None) -> tuple[str, str] | None:
    """The ``(url, token)`` saved by ``trainhub login``, or None."""
    path = path or credentials_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("url"), str):
        token = data.get("token")
        if isinstance(token, str) and token:
            return normalize_url(data["url"]), token
    return None


def resolve_connection(url: str | None = None, token: str | None = None) -> Connection:
    """Choose the URL and token: arguments, then environment, then the saved login."""
    saved = load_credentials()
    if url:
        chosen_url, url_source = normalize_url(url), "argument"
    elif os.environ.get("TRAINHUB_URL"):
        chosen_url, url_source = normalize_url(os.environ["TRAINHUB_URL"]), "TRAINHUB_URL"
    elif saved:
        chosen_url, url_source = saved[0], str(credentials_path())
    else:
        chosen_url, url_source = DEFAULT_URL, "default"
    if token:
        return Connection(chosen_url, token, url_source, "argument")
    if os.environ.get("TRAINHUB_TOKEN"):
        return Connection(chosen_url, os.environ["TRAINHUB_TOKEN"], url_source, "TRAINHUB_TOKEN")
    # a saved token goes only to the server it was issued for
    if saved and saved[0] == chosen_url:
        return Connection(chosen_url, saved[1], url_source, str(credentials_path()))
    return Connection(chosen_url, None, url_source, None)
