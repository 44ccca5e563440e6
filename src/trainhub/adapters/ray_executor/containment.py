"""Applies a rank's :class:`~trainhub.core.isolation.IsolationProfile` on its node.

The profile is data (core/isolation.py); this is where it meets the kernel: the rank's cgroup
(adapters/cgroups.py), the trial's network namespace and its API relay (adapters/trial_network.py),
the seccomp filter (adapters/seccomp.py) and the bwrap arguments (adapters/sandbox.py). The rank
actor calls :meth:`Containment.prepare` before it starts the rank, :meth:`Containment.enter` in
the forked child, :meth:`Containment.exit_reason` when the rank ended and
:meth:`Containment.remove` on cleanup.

This module is imported inside Ray worker processes: standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import ipaddress
import os
import re
import socket
from collections.abc import MutableMapping
from urllib.parse import urlsplit, urlunsplit

from trainhub.adapters import cgroups, seccomp, trial_network
from trainhub.adapters.sandbox import SandboxPlan
from trainhub.core.isolation import (
    DENIED_SYSCALLS,
    IsolationProfile,
    NetworkMode,
    NodeIsolation,
    TrialResources,
    isolation_profile,
    memory_exceeded,
)

API_URL_ENV = "TRAINHUB_API_URL"  # trainhub.runtime.protocol.ENV_API_URL


class ContainmentError(RuntimeError):
    """The profile asks for something this node cannot do (the rank fails with this reason)."""


class Containment:
    """One rank's cgroup, network namespace and seccomp filter."""

    def __init__(
        self,
        profile: IsolationProfile,
        group: cgroups.BaseRankCgroup | None,
        network: trial_network.TrialNetwork | None,
        relay: trial_network.ApiRelay | None,
        seccomp_fd: int | None,
    ) -> None:
        self.profile = profile
        self.cgroup = group
        self.network = network
        self._relay = relay
        self._seccomp_fd = seccomp_fd
        self._netns_fd = network.open() if network is not None else None

    @classmethod
    def prepare(
        cls,
        attempt_id: str,
        rank_id: str,
        rank: int,
        resources: TrialResources,
        node: NodeIsolation,
        *,
        num_nodes: int,
        env: MutableMapping[str, str],
    ) -> Containment:
        """Make the rank's cgroup, join or make the trial's network, compile the filter.

        ``attempt_id`` names the attempt's network on this node and ``rank_id`` the rank's
        cgroup: both must be unique on the node, whatever else runs there (two control planes
        on one node both have a trial 1): the placement group's and the actor's Ray ids are.
        ``env`` (the rank's environment) is adjusted for a trial network: the rendezvous on
        loopback, the API's address as the relay serves it.
        """
        profile = isolation_profile(dataclasses.replace(resources, num_nodes=num_nodes), node)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"rank{rank}-{rank_id}")
        group = network = relay = None
        fd = None
        try:
            if profile.limits is not None:
                group = cgroups.create_rank_cgroup(name, profile.limits)
            if profile.network == NetworkMode.TRIAL:
                network, relay = _trial_network(attempt_id, env)
            if profile.denied_syscalls:
                fd = seccomp.filter_fd(profile.denied_syscalls)
            return cls(profile, group, network, relay, fd)
        except (OSError, RuntimeError) as exc:
            if relay is not None:
                relay.close()
            if group is not None:
                group.remove(timeout_s=0)
            raise ContainmentError(f"cannot contain rank {rank}: {exc}") from exc

    def sandbox_plan(self, plan: SandboxPlan) -> SandboxPlan:
        """``plan`` with this profile and filter (bwrap applies namespaces, tmpfs, seccomp)."""
        return dataclasses.replace(plan, profile=self.profile, seccomp_fd=self._seccomp_fd)

    def pass_fds(self) -> tuple[int, ...]:
        """Descriptors the rank's bwrap must inherit (the seccomp program)."""
        return (self._seccomp_fd,) if self._seccomp_fd is not None else ()

    def enter(self) -> None:
        """In the forked child, before exec: join the cgroup, then the trial's network."""
        if self.cgroup is not None:
            self.cgroup.join()
        if self._netns_fd is not None:
            trial_network.join(self._netns_fd)

    def started(self) -> None:
        """The rank's process runs: bwrap has its own copy of the filter's descriptor."""
        if self._seccomp_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._seccomp_fd)
            self._seccomp_fd = None

    def exit_reason(self, rank: int) -> str | None:
        """Why the rank ended, when its cgroup knows (the kernel OOM-killed a process in it)."""
        limits = self.profile.limits
        if self.cgroup is None or limits is None or limits.memory_bytes is None:
            return None
        if self.cgroup.oom_kills() == 0:
            return None
        return memory_exceeded(rank, limits.memory_bytes, self.cgroup.peak_memory_bytes())

    def cpu_time_s(self) -> float:
        return self.cgroup.cpu_time_s() if self.cgroup is not None else 0.0

    def remove(self, *, last_on_node: bool) -> None:
        """Release the relay and the cgroup; the network's name too when no rank is left."""
        self.started()
        if self._relay is not None:
            self._relay.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self._netns_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._netns_fd)
            self._netns_fd = None
        if last_on_node and self.network is not None:
            self.network.remove()


def _trial_network(
    attempt_id: str, env: MutableMapping[str, str]
) -> tuple[trial_network.TrialNetwork, trial_network.ApiRelay | None]:
    """The attempt's namespace on this node, and the API relay if this rank serves it."""
    name = trial_network.namespace_name(attempt_id)
    relay = None
    if not env.get(API_URL_ENV):  # a launch without the control plane (benchmarks, tests)
        network = trial_network.TrialNetwork.ensure(name, [])
    else:
        url = urlsplit(env[API_URL_ENV])
        if not url.hostname or url.scheme not in ("http", "https"):
            raise ContainmentError(f"{API_URL_ENV} is not an http(s) URL: {env[API_URL_ENV]!r}")
        port = url.port or (443 if url.scheme == "https" else 80)
        address = _resolve(url.hostname)
        network = trial_network.TrialNetwork.ensure(name, [address])
        try:
            relay = trial_network.ApiRelay(network, (address, port), (url.hostname, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:  # in use: another rank of the node relays
                raise
        if address != url.hostname:  # no name service in the namespace: name the address
            netloc = f"{address}:{port}" if url.port else address
            env[API_URL_ENV] = urlunsplit(url._replace(netloc=netloc))
    # the ranks of the trial on this node rendezvous on the namespace's loopback
    env["MASTER_ADDR"] = "127.0.0.1"
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["NCCL_SOCKET_IFNAME"] = "lo"
    return network, relay


def _resolve(host: str) -> str:
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    return socket.gethostbyname(host)


def resolve_isolation(pids_per_rank: int) -> tuple[NodeIsolation, list[str]]:
    """What this node can contain, and a warning for each part it cannot (skipped, never faked).

    The control plane's node stands for every node of its cluster: the nodes of one cluster
    are expected to be alike (a rank whose node lacks what the profile asks for fails with
    the reason instead of running uncontained).
    """
    warnings: list[str] = []
    cgroup_why = cgroups.cgroup_problem()
    if cgroup_why:
        warnings.append(f"ranks run without resource limits: {cgroup_why}")
    network_why = trial_network.network_problem()
    if network_why:
        warnings.append(f"trials share the node's network: {network_why}")
    seccomp_why = None
    try:
        seccomp.compiled_filter(DENIED_SYSCALLS)
    except seccomp.SeccompUnavailable as exc:
        seccomp_why = str(exc)
        warnings.append(f"ranks run without a seccomp filter: {exc}")
    node = NodeIsolation(
        cgroups=cgroup_why is None,
        network=network_why is None,
        seccomp=seccomp_why is None,
        pids_per_rank=pids_per_rank,
    )
    return node, warnings
