"""A Python client of the trainhub REST API (``/api/v1``), for the CLI and for notebooks.

The client is a thin layer over httpx: every method is one request, returns the decoded JSON
body (plain dicts and lists, shaped as in the OpenAPI schema at ``/api/v1/docs``) and raises
:class:`ApiError` for an error response or :class:`ServerUnreachable` when no server answers.
It imports nothing of the server side, so it is cheap to import anywhere.

Example::

    from trainhub.client import TrainhubClient

    with TrainhubClient.from_env() as th:          # TRAINHUB_URL/TRAINHUB_TOKEN or `trainhub login`
        exp = th.submit_experiment(open("experiment.yaml").read(), context=archive_bytes)
        trial = th.wait_for_trial(exp["trial_ids"][0])
        print(trial["state"], trial["latest_metrics"])

Where the connection comes from (first match wins): the arguments, the environment
(``TRAINHUB_URL``, ``TRAINHUB_TOKEN``), the file ``trainhub login`` saved
(``$XDG_CONFIG_HOME/trainhub/credentials.json``, by default under ``~/.config``), and
``http://127.0.0.1:8080``. A saved token is only sent to the URL it was saved for.

The modules: ``errors`` (what the client raises), ``credentials`` (choosing and saving the URL
and token; no HTTP), ``polling`` (the pacing of every follow and wait loop, with an injectable
sleep and clock) and ``api`` (:class:`TrainhubClient`, one method per endpoint).
"""

from trainhub.client.api import API_PREFIX, JSON, TERMINAL_STATES, TrainhubClient
from trainhub.client.credentials import (
    DEFAULT_URL,
    Connection,
    credentials_path,
    load_credentials,
    normalize_url,
    resolve_connection,
    save_credentials,
)
from trainhub.client.errors import ApiError, ClientError, ServerUnreachable
from trainhub.client.polling import polls

__all__ = [
    "API_PREFIX",
    "DEFAULT_URL",
    "JSON",
    "TERMINAL_STATES",
    "ApiError",
    "ClientError",
    "Connection",
    "ServerUnreachable",
    "TrainhubClient",
    "credentials_path",
    "load_credentials",
    "normalize_url",
    "polls",
    "resolve_connection",
    "save_credentials",
]
