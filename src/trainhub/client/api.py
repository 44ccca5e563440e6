"""The HTTP client of the trainhub REST API (``/api/v1``): one method per endpoint.

Every method but the polling ones is one request, returns the decoded JSON body (plain dicts
and lists, shaped as in the OpenAPI schema at ``/api/v1/docs``) and raises
:class:`~trainhub.client.errors.ApiError` for an error response or
:class:`~trainhub.client.errors.ServerUnreachable` when no server answers.
The polling ones (``iter_logs`` with ``follow``, ``watch_trial``, ``wait_for_trial``) are paced
by :func:`~trainhub.client.polling.polls` and take its ``sleep`` (and ``clock``), so tests need
not wait.

The module is longer than most because it reads as a table of the API, one short method per
endpoint grouped by resource; splitting it would scatter that table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from trainhub.client.credentials import DEFAULT_URL, normalize_url, resolve_connection
from trainhub.client.errors import ApiError, ServerUnreachable, unreachable_reason
from trainhub.client.polling import polls

API_PREFIX = "/api/v1"

JSON = dict[str, Any]

TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELED", "PRUNED"})
"""The trial states after which nothing changes any more: polling a trial stops there."""


class TrainhubClient:
    """A connection to one trainhub server.

    Args:
        url: the server URL, e.g. ``http://127.0.0.1:8080``.
        token: an API token (``trainhub tokens create``); None for unauthenticated calls.
        timeout_s: per-request timeout in seconds (uploads get four times as long).
        transport: an httpx transport, for tests.

    Example::

        client = TrainhubClient("http://127.0.0.1:8080", token)
        for e in client.list_experiments(limit=5)["data"]:
            print(e["id"], e["name"], e["state"])
        client.close()

    The client is safe to use from one thread at a time; make one per thread otherwise.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        import trainhub

        self.url = normalize_url(url)
        self.timeout_s = timeout_s
        headers = {"User-Agent": f"trainhub-client/{trainhub.__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.has_token = bool(token)
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX, headers=headers, timeout=timeout_s, transport=transport
        )

    @classmethod
    def from_env(cls, url: str | None = None, token: str | None = None) -> TrainhubClient:
        """A client for the URL and token that :func:`resolve_connection` chooses."""
        connection = resolve_connection(url, token)
        return cls(connection.url, connection.token)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TrainhubClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            raise ServerUnreachable(self.url, unreachable_reason(exc)) from None
        except httpx.TimeoutException:
            reason = f"no answer within {self.timeout_s:g} s"
            raise ServerUnreachable(self.url, reason, timed_out=True) from None
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.url, unreachable_reason(exc)) from None
        if response.status_code >= 400:
            raise ApiError.from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -- identity --

    def me(self) -> JSON:
        """Who the token belongs to: ``{"username", "is_admin", "roles": {tenant: role}}``."""
        result: JSON = self._json("GET", "/me")
        return result

    # -- experiments --

    def submit_experiment(
        self, spec: str, context: bytes | None = None, tenant: str | None = None
    ) -> JSON:
        """Submit an experiment; returns at once with its trials QUEUED.

        Args:
            spec: the experiment spec, YAML text.
            context: the code directory as a tar.gz archive (``trainhub submit`` builds it,
                honouring .gitignore and .trainhubignore).
            tenant: the tenant to submit to; default: the user's only tenant.

        Returns:
            The experiment with its trials (``id``, ``trial_ids``, ``trials``, ...).

        Raises:
            ApiError: ``invalid_spec`` (422) lists every bad field in ``errors``.
        """
        data = {"spec": spec}
        if tenant:
            data["tenant"] = tenant
        files = {"context": ("context.tar.gz", context, "application/gzip")} if context else None
        result: JSON = self._json(
            "POST", "/experiments", data=data, files=files, timeout=self.timeout_s * 4
        )
        return result

    def list_experiments(
        self,
        state: str | None = None,
        limit: int = 50,
        offset: int = 0,
        *,
        tenant: str | None = None,
        user: str | None = None,
        sort: str = "created",
        order: str = "desc",
    ) -> JSON:
        """Experiments visible to the caller (newest first unless ``sort``/``order`` say
        otherwise; ``sort``: created, name or best): ``{"data": [...], "count": N}``."""
        params: dict[str, Any] = {"limit": limit, "offset": offset, "sort": sort, "order": order}
        if state:
            params["state"] = state.upper()
        if tenant:
            params["tenant"] = tenant
        if user:
            params["user"] = user
        result: JSON = self._json("GET", "/experiments", params=params)
        return result

    def get_experiment(self, experiment_id: int) -> JSON:
        """One experiment with its spec and trials."""
        result: JSON = self._json("GET", f"/experiments/{experiment_id}")
        return result

    def cancel_experiment(self, experiment_id: int) -> JSON:
        """Cancel every trial of the experiment that has not ended (idempotent)."""
        result: JSON = self._json("POST", f"/experiments/{experiment_id}/cancel")
        return result

    # -- trials --

    def get_trial(self, trial_id: int) -> JSON:
        """One trial with its attempts, checkpoints, recent events, progress and latest metrics."""
        result: JSON = self._json("GET", f"/trials/{trial_id}")
        return result

    def cancel_trial(self, trial_id: int) -> JSON:
        """Cancel one trial (idempotent); a running one stops within a scheduler tick."""
        result: JSON = self._json("POST", f"/trials/{trial_id}/cancel")
        return result

    def list_metrics(
        self, trial_id: int, after_step: int | None = None, limit: int = 10_000
    ) -> list[JSON]:
        """Metric points of a trial in step order: ``[{"step", "attempt", "values", ...}]``."""
        params: dict[str, Any] = {"limit": limit}
        if after_step is not None:
            params["after_step"] = after_step
        data: list[JSON] = self._json("GET", f"/trials/{trial_id}/metrics", params=params)["data"]
        return data

    def list_layer_alerts(self, trial_id: int, limit: int = 1000) -> list[JSON]:
        """Layer-health alerts of a trial, earliest first:
        ``[{"kind", "layer", "step", "last_step", "value", "message"}]``."""
        params = {"limit": limit}
        data: list[JSON] = self._json("GET", f"/trials/{trial_id}/alerts", params=params)["data"]
        return data

    def list_checkpoints(self, trial_id: int) -> list[JSON]:
        """The trial's kept checkpoints: ``[{"id", "uuid", "step", "metrics", "size_bytes"}]``."""
        data: list[JSON] = self._json("GET", f"/trials/{trial_id}/checkpoints")["data"]
        return data

    def download_checkpoint(self, trial_id: int, checkpoint_id: int) -> bytes:
        """The bytes of one checkpoint file (load with ``torch.load(io.BytesIO(data))``).

        Holds the whole file in memory; for large ones use :meth:`save_checkpoint_file`.
        """
        path = f"/trials/{trial_id}/checkpoints/{checkpoint_id}/file"
        return self._request("GET", path, timeout=self.timeout_s * 4).content

    def save_checkpoint_file(self, trial_id: int, checkpoint_id: int, destination: Path) -> int:
        """Stream one checkpoint file to ``destination`` in chunks; returns its size in bytes.

        Memory stays flat whatever the size; the file appears whole or not at all.

        Example::

            th.save_checkpoint_file(12, 3, Path("model.pt"))
            state = torch.load("model.pt")
        """
        path = f"/trials/{trial_id}/checkpoints/{checkpoint_id}/file"
        partial = destination.with_name(destination.name + ".part")
        size = 0
        try:
            with self._http.stream("GET", path, timeout=self.timeout_s * 4) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ApiError.from_response(response)
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
                        size += len(chunk)
            partial.replace(destination)
        except httpx.ConnectError as exc:
            raise ServerUnreachable(self.url, unreachable_reason(exc)) from None
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.url, unreachable_reason(exc)) from None
        finally:
            partial.unlink(missing_ok=True)
        return size

    def read_logs(
        self,
        trial_id: int,
        rank: int = 0,
        attempt: int | None = None,
        offset: int = 0,
        limit: int = 256 * 1024,
    ) -> JSON:
        """One chunk of a rank's output from a byte offset.

        Returns:
            ``{"attempt", "rank", "offset", "next_offset", "text", "data_b64", "complete"}``;
            ``complete`` is true when the attempt has ended (then, once ``next_offset`` stops
            moving, the log is whole). ``attempt`` is 0 while the trial has no attempt yet.
        """
        params: dict[str, Any] = {"rank": rank, "offset": offset, "limit": limit}
        if attempt is not None:
            params["attempt"] = attempt
        result: JSON = self._json("GET", f"/trials/{trial_id}/logs", params=params)
        return result

    def iter_logs(
        self,
        trial_id: int,
        rank: int = 0,
        attempt: int | None = None,
        *,
        follow: bool = False,
        poll_interval_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[JSON]:
        """Yield the non-empty log chunks of one rank, in order.

        Without ``follow`` it stops at the current end of the log. With ``follow`` it keeps
        polling until the attempt has ended and everything is read; when no ``attempt`` is
        given it also waits for the trial's first attempt and moves on to the next attempt
        when the trial restarts, until the trial itself has ended. It waits
        ``poll_interval_s`` (with ``sleep``) only when there was nothing new to read.

        Example::

            for chunk in client.iter_logs(7, follow=True):
                print(chunk["text"], end="")
        """
        current = attempt
        offset = 0
        for _ in polls(poll_interval_s, sleep=sleep):
            while True:  # read on without waiting while there is output or a newer attempt
                chunk = self.read_logs(trial_id, rank, current, offset)
                if current is None and chunk["attempt"]:
                    current = chunk["attempt"]  # pin it: a restart must not shift our offset
                if chunk["next_offset"] > offset:
                    offset = chunk["next_offset"]
                    yield chunk
                    continue
                if not follow:
                    return
                if not chunk["complete"]:
                    break  # the attempt is still writing
                if attempt is not None:
                    return
                trial = self.get_trial(trial_id)
                latest = max((a["number"] for a in trial["attempts"]), default=0)
                if latest > chunk["attempt"]:
                    current, offset = chunk["attempt"] + 1, 0
                    continue
                if trial["state"] in TERMINAL_STATES:
                    return
                break  # ended, but the trial may restart it: ask again later

    def watch_trial(
        self,
        trial_id: int,
        poll_interval_s: float = 1.0,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[JSON]:
        """Yield the trial's details every ``poll_interval_s`` until (and including) its end.

        Example::

            for trial in client.watch_trial(7):
                print(trial["state"], trial["latest_metrics"])
        """
        for _ in polls(poll_interval_s, sleep=sleep):
            trial = self.get_trial(trial_id)
            yield trial
            if trial["state"] in TERMINAL_STATES:
                return

    def wait_for_trial(
        self,
        trial_id: int,
        poll_interval_s: float = 2.0,
        timeout_s: float | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> JSON:
        """Block until the trial has ended; return its final details.

        Raises:
            TimeoutError: ``timeout_s`` passed first (the trial keeps running).
        """
        trial: JSON = {}
        for _ in polls(poll_interval_s, timeout_s=timeout_s, sleep=sleep, clock=clock):
            trial = self.get_trial(trial_id)
            if trial["state"] in TERMINAL_STATES:
                return trial
        raise TimeoutError(f"trial {trial_id} is still {trial['state']}")

    # -- searches and steering --

    def search_progress(self, experiment_id: int) -> JSON:
        """A search's progress: ``{"search_state", "counts", "best", "data": [trial results,
        best first, each with "id", "state", "hparams", "metric", "epochs", "stop_detail"]}``."""
        result: JSON = self._json("GET", f"/experiments/{experiment_id}/search")
        return result

    def set_search_limits(
        self,
        experiment_id: int,
        max_trials: int | None = None,
        max_concurrent_trials: int | None = None,
    ) -> JSON:
        """Raise or lower a running search's limits; returns its progress."""
        body = {"max_trials": max_trials, "max_concurrent_trials": max_concurrent_trials}
        result: JSON = self._json("PATCH", f"/experiments/{experiment_id}/search", json=body)
        return result

    def importance(self, experiment_id: int) -> dict[str, float]:
        """Optuna's hyperparameter importance of a search (empty with < 2 completed trials)."""
        result: dict[str, float] = self._json("GET", f"/experiments/{experiment_id}/importance")[
            "importance"
        ]
        return result

    def steer(self, kind: str, object_id: int, action: str) -> JSON:
        """``pause``, ``resume`` or ``kill`` an ``experiment`` or a ``trial``."""
        result: JSON = self._json("POST", f"/{kind}s/{object_id}/{action}")
        return result

    def clone_experiment(
        self, experiment_id: int, changes: dict[str, Any], from_checkpoint_trial: int | None
    ) -> JSON:
        """Submit a copy with changes (``{"lr": 0.01, "searcher.max_trials": 64}``)."""
        body = {"set": changes, "from_checkpoint_trial": from_checkpoint_trial}
        result: JSON = self._json("POST", f"/experiments/{experiment_id}/clone", json=body)
        return result

    def clone_trial(
        self,
        trial_id: int,
        changes: dict[str, Any],
        from_checkpoint: bool,
        *,
        drop_flagged: float | None = None,
        relabel: dict[int, int] | None = None,
    ) -> JSON:
        """A single-trial experiment with this trial's hyperparameters, changed as asked;
        without the ``drop_flagged`` fraction of its most suspicious samples and with the
        ``relabel`` labels (sample id -> label) when given."""
        body: JSON = {"set": changes, "from_checkpoint": from_checkpoint}
        if drop_flagged is not None:
            body["drop_flagged"] = drop_flagged
        if relabel:
            body["relabel"] = {str(k): v for k, v in relabel.items()}
        result: JSON = self._json("POST", f"/trials/{trial_id}/clone", json=body)
        return result

    # -- debugging a trial's data (docs/debugging.md) --

    def debug_report(self, trial_id: int, top: int = 20, score: str = "aum") -> JSON:
        """Likely mislabeled samples, regions, per-class accuracy, confusion matrix."""
        params = {"top": top, "score": score}
        result: JSON = self._json("GET", f"/trials/{trial_id}/debug", params=params)
        return result

    def debug_csv(self, trial_id: int, score: str = "aum") -> str:
        """Every tracked sample's scores as CSV, most suspicious first."""
        path = f"/trials/{trial_id}/debug/samples.csv"
        return self._request("GET", path, params={"score": score}).text

    def debug_png(self, trial_id: int, top: int = 25) -> bytes:
        """A PNG grid of the most suspicious samples' images."""
        path = f"/trials/{trial_id}/debug/grid.png"
        return self._request("GET", path, params={"top": top}).content

    def list_templates(self) -> list[JSON]:
        """Templates of the caller's tenants: ``[{"tenant", "name", "spec_yaml", ...}]``."""
        result: list[JSON] = self._json("GET", "/templates")["data"]
        return result

    def save_template(
        self,
        name: str,
        spec: str | None = None,
        context: bytes | None = None,
        tenant: str | None = None,
        experiment_id: int | None = None,
    ) -> JSON:
        """Save a spec (with its code) or an experiment as the tenant's template ``name``."""
        if experiment_id is not None:
            body = {"name": name}
            result: JSON = self._json("POST", f"/experiments/{experiment_id}/template", json=body)
            return result
        data = {"name": name, "spec": spec or ""}
        if tenant:
            data["tenant"] = tenant
        files = {"context": ("context.tar.gz", context, "application/gzip")} if context else None
        result = self._json("POST", "/templates", data=data, files=files)
        return result

    def submit_template(
        self, name: str, changes: dict[str, Any], tenant: str | None = None
    ) -> JSON:
        """Submit a template with changes; returns the experiment."""
        body = {"set": changes, "tenant": tenant}
        result: JSON = self._json("POST", f"/templates/{name}/submit", json=body)
        return result

    # -- the queue, priorities, usage --

    def queue(self) -> JSON:
        """Queued (and paused) trials one may see, in the order the scheduler would start them:
        ``{"data": [trial, ...], "count": N}``; each trial has ``queue_position`` (set by the
        scheduler's last pass; None before it) and ``pending_reason``."""
        result: JSON = self._json("GET", "/queue")
        return result

    def set_priority(self, trial_id: int, priority: str) -> JSON:
        """Change a trial's priority (``low``, ``normal``, ``high``; admins: ``urgent``); the
        scheduler uses it from its next pass. Returns the trial."""
        result: JSON = self._json("PATCH", f"/trials/{trial_id}", json={"priority": priority})
        return result

    def usage(self, since: float | None = None, until: float | None = None) -> JSON:
        """Allocated slot-hours in ``[since, until)`` (Unix seconds; default: the last 7 days).

        Returns:
            ``{"since", "until", "data": [{"day", "tenant", "user", "project", "slot_hours"}],
            "tenants": [{"tenant", "guaranteed_slots", "slot_hours", "average_slots",
            "share_of_guarantee", "guarantee_kept"}]}``; days are UTC dates,
            ``share_of_guarantee`` is None for a tenant without a guarantee, ``guarantee_kept``
            (received over entitled GPU-time) for one entitled to nothing in the period.
        """
        result: JSON = self._json("GET", "/usage", params=_period(since, until))
        return result

    # -- nodes (monitoring) --

    # -- interactive sessions (docs/sessions.md) --

    def start_session(self, **request: Any) -> JSON:
        """Queue a notebook, shell or tensorboard session: ``kind``, ``gpus``,
        ``idle_timeout_s``, ``data`` (NAME:/MOUNT), ``requirements`` (text), ``trials``."""
        result: JSON = self._json("POST", "/sessions", json=request)
        return result

    def sessions(self, include_ended: bool = False) -> JSON:
        result: JSON = self._json("GET", "/sessions", params={"all": include_ended})
        return result

    def session(self, session_id: int) -> JSON:
        result: JSON = self._json("GET", f"/sessions/{session_id}")
        return result

    def stop_session(self, session_id: int) -> JSON:
        result: JSON = self._json("POST", f"/sessions/{session_id}/stop")
        return result

    def session_request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request through the proxy to a session's server (``path`` from its ``url``)."""
        try:
            return self._http.request(method, self.url + path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.url, unreachable_reason(exc)) from None

    @property
    def auth_headers(self) -> dict[str, str]:
        return {k: v for k, v in self._http.headers.items() if k.lower() == "authorization"}

    def environments(self) -> JSON:
        """The cached trial environments: ``{"data", "count"}`` (docs/environments.md)."""
        result: JSON = self._json("GET", "/environments")
        return result

    def remove_environment(self, key: str) -> JSON:
        """Admins: remove a cached environment by its key or a prefix of it (6+ digits)."""
        result: JSON = self._json("DELETE", f"/environments/{key}")
        return result

    def trial_environment(self, trial_id: int) -> JSON:
        """The environment a trial runs in, with its ``build_log``."""
        result: JSON = self._json("GET", f"/trials/{trial_id}/environment")
        return result

    def nodes(self) -> JSON:
        """Every node: hardware, health, admin controls, latest sample: ``{"data", "count"}``."""
        result: JSON = self._json("GET", "/nodes")
        return result

    def node_health(self, node: str, limit: int = 20) -> list[JSON]:
        """A node's health changes, newest first."""
        result: list[JSON] = self._json("GET", f"/nodes/{node}/health", params={"limit": limit})
        return result

    def control_node(self, node: str, action: str, reason: str = "") -> JSON:
        """Admins: ``cordon`` (no new trials), ``drain`` (cordon and preempt its trials by
        checkpoint) or ``uncordon`` a node, by id, id prefix or hostname. Returns the node."""
        result: JSON = self._json("POST", f"/nodes/{node}/{action}", json={"reason": reason})
        return result

    def label_node(self, node: str, labels: dict[str, str]) -> JSON:
        """Admins: set labels on a node (``{"rack": "r3"}``; an empty value removes one)."""
        result: JSON = self._json("POST", f"/nodes/{node}/labels", json={"labels": labels})
        return result

    def request_profile(self, trial_id: int, steps: int = 20) -> JSON:
        """Profile a running trial's next ``steps`` steps on every rank (torch.profiler)."""
        result: JSON = self._json("POST", f"/trials/{trial_id}/profiles", json={"steps": steps})
        return result

    def get_profile(self, trial_id: int, profile_id: int) -> JSON:
        """A profile: ``state`` and, per rank, ``top_ops`` (operators by self time)."""
        result: JSON = self._json("GET", f"/trials/{trial_id}/profiles/{profile_id}")
        return result

    def profile_trace(self, trial_id: int, profile_id: int, rank: int) -> bytes:
        """One rank's gzip-compressed Chrome trace (opens in https://ui.perfetto.dev)."""
        path = f"/trials/{trial_id}/profiles/{profile_id}/ranks/{rank}/trace"
        return self._request("GET", path, timeout=self.timeout_s * 4).content

    def usage_csv(self, since: float | None = None, until: float | None = None) -> str:
        """The same usage rows as CSV text: ``day,tenant,user,project,slot_hours``."""
        params = {**_period(since, until), "format": "csv"}
        return self._request("GET", "/usage", params=params).text

    # -- administration --

    def list_tenants(self) -> list[JSON]:
        data: list[JSON] = self._json("GET", "/tenants")["data"]
        return data

    def create_tenant(
        self,
        name: str,
        guaranteed_slots: int = 0,
        limit_slots: int | None = None,
        weight: float = 1.0,
    ) -> JSON:
        """Create a tenant (admins). Slots are GPUs (or configured CPU shares)."""
        body = {
            "name": name,
            "guaranteed_slots": guaranteed_slots,
            "limit_slots": limit_slots,
            "weight": weight,
        }
        result: JSON = self._json("POST", "/tenants", json=body)
        return result

    def update_tenant(
        self,
        name: str,
        guaranteed_slots: int | None = None,
        limit_slots: int | None = None,
        weight: float | None = None,
        clear_limit: bool = False,
        *,
        max_checkpoint_bytes: int | None = None,
        max_trial_storage_bytes: int | None = None,
        max_storage_bytes: int | None = None,
        clear_storage_quotas: bool = False,
    ) -> JSON:
        """Change a tenant's quotas (admins); ``None`` leaves a field as it is.

        The storage quotas bound the checkpoints the tenant keeps: one file, one trial's,
        and the whole tenant's, in bytes; ``clear_storage_quotas`` returns to the server's
        defaults (16 GiB, 64 GiB, 1 TiB).
        """
        body: JSON = {"clear_limit": clear_limit, "clear_storage_quotas": clear_storage_quotas}
        for key, value in (
            ("max_checkpoint_bytes", max_checkpoint_bytes),
            ("max_trial_storage_bytes", max_trial_storage_bytes),
            ("max_storage_bytes", max_storage_bytes),
        ):
            if value is not None:
                body[key] = value
        if guaranteed_slots is not None:
            body["guaranteed_slots"] = guaranteed_slots
        if limit_slots is not None:
            body["limit_slots"] = limit_slots
        if weight is not None:
            body["weight"] = weight
        result: JSON = self._json("PATCH", f"/tenants/{name}", json=body)
        return result

    def list_users(self) -> list[JSON]:
        data: list[JSON] = self._json("GET", "/users")["data"]
        return data

    def create_user(self, username: str, is_admin: bool = False) -> JSON:
        result: JSON = self._json(
            "POST", "/users", json={"username": username, "is_admin": is_admin}
        )
        return result

    def set_membership(self, username: str, tenant: str, role: str = "member") -> JSON:
        """Add a user to a tenant, or change their role there (admin, member, viewer)."""
        result: JSON = self._json(
            "PUT", f"/users/{username}/memberships", json={"tenant": tenant, "role": role}
        )
        return result

    def remove_membership(self, username: str, tenant: str) -> None:
        self._request("DELETE", f"/users/{username}/memberships/{tenant}")

    def list_tokens(self) -> list[JSON]:
        data: list[JSON] = self._json("GET", "/tokens")["data"]
        return data

    def create_token(
        self, name: str = "", username: str | None = None, ttl_s: float | None = None
    ) -> JSON:
        """Issue an API token; the secret is in ``["token"]`` of the result and shown only once.

        Args:
            name: a label for the token.
            username: admins: issue it for another user.
            ttl_s: seconds until it expires; ``None``: never.
        """
        body = {"name": name, "username": username, "ttl_s": ttl_s}
        result: JSON = self._json("POST", "/tokens", json=body)
        return result

    def revoke_token(self, token_id: int) -> None:
        self._request("DELETE", f"/tokens/{token_id}")

    def cluster(self) -> JSON:
        """The cluster's nodes: ``{"nodes": [...], "total_gpus", "total_cpus"}``."""
        result: JSON = self._json("GET", "/cluster")
        return result

    # --- the model registry (docs/models.md) ---

    def list_models(self, limit: int = 100) -> list[JSON]:
        """Models of the caller's tenants and those shared with them, each with versions."""
        data: list[JSON] = self._json("GET", "/models", params={"limit": limit})["data"]
        return data

    def get_model(self, name: str, tenant: str | None = None) -> JSON:
        result: JSON = self._json("GET", f"/models/{name}", params=_owner(tenant))
        return result

    def get_model_version(self, name: str, version: int, tenant: str | None = None) -> JSON:
        path = f"/models/{name}/versions/{version}"
        result: JSON = self._json("GET", path, params=_owner(tenant))
        return result

    def register_model(
        self,
        trial_id: int,
        name: str,
        checkpoint_id: int | None = None,
        *,
        description: str = "",
        arch: JSON | None = None,
        metrics: dict[str, float] | None = None,
        lineage: JSON | None = None,
    ) -> JSON:
        """Register a checkpoint of a trial (default: its latest) as the next version of
        ``name``; answers the version (``ref`` is what ``model.init_from`` takes)."""
        body: JSON = {"trial_id": trial_id, "name": name, "description": description}
        if checkpoint_id is not None:
            body["checkpoint_id"] = checkpoint_id
        if arch:
            body["arch"] = arch
        if metrics:
            body["metrics"] = metrics
        if lineage:
            body["lineage"] = lineage
        result: JSON = self._json("POST", "/models", json=body)
        return result

    def download_model(self, name: str, version: int, tenant: str | None = None) -> bytes:
        """The version's weights file (``torch.load(io.BytesIO(data))``)."""
        path = f"/models/{name}/versions/{version}/file"
        return self._request("GET", path, params=_owner(tenant), timeout=self.timeout_s * 4).content

    def delete_model_version(self, name: str, version: int, tenant: str | None = None) -> JSON:
        """Delete one version of a model (refused with 409 while a trial uses it)."""
        path = f"/models/{name}/versions/{version}"
        result: JSON = self._json("DELETE", path, params=_owner(tenant))
        return result

    def share_model(
        self, name: str, tenant: str, shared: bool = True, owner: str | None = None
    ) -> JSON:
        method = "PUT" if shared else "DELETE"
        params = {"owner": owner} if owner else {}
        result: JSON = self._json(method, f"/models/{name}/shares/{tenant}", params=params)
        return result


def _period(since: float | None, until: float | None) -> dict[str, float]:
    params: dict[str, float] = {}
    if since is not None:
        params["since"] = since
    if until is not None:
        params["until"] = until
    return params


def _owner(tenant: str | None) -> dict[str, str]:
    return {"tenant": tenant} if tenant else {}
