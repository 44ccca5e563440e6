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
from collections.abc import MutableMapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from trainhub.adapters import (
    cgroups,
    node_leftovers,
    seccomp,
    trial_network,
    trial_traffic,
    trial_tunnel,
)
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
from trainhub.core.traffic import NamespaceSample

API_URL_ENV = "TRAINHUB_API_URL"  # trainhub.runtime.protocol.ENV_API_URL
_LAST_SWEEP: list[float] = []  # when this process last swept its node (node_leftovers.py)


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
        holds: dict[str, node_leftovers.Hold] | None = None,
    ) -> None:
        self.profile = profile
        self._holds = holds or {}  # "cgroup", "network": what a sweep removes if we die
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
        node_ips: Sequence[str] = (),
        node_ip: str = "",
    ) -> Containment:
        """Make the rank's cgroup, join or make the trial's network, compile the filter.

        ``attempt_id`` names the attempt's network on this node and ``rank_id`` the rank's
        cgroup: both must be unique on the node, whatever else runs there (two control planes
        on one node both have a trial 1): the placement group's and the actor's Ray ids are.
        ``env`` (the rank's environment) is adjusted for a trial network: the rendezvous on
        loopback, the API's address as the relay serves it. A trial on several nodes
        (``node_ips``: their addresses in the order of the trial's first rank on each, this
        node's ``node_ip`` among them) gets a tunnel between its namespaces (trial_tunnel.py).
        """
        node_leftovers.sweep_quietly(_LAST_SWEEP)  # what dead actors left on this node
        profile = isolation_profile(dataclasses.replace(resources, num_nodes=num_nodes), node)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"rank{rank}-{rank_id}")
        group = network = relay = None
        fd = None
        holds: dict[str, node_leftovers.Hold] = {}
        try:
            if profile.limits is not None:
                group = cgroups.create_rank_cgroup(name, profile.limits)
                holds["cgroup"] = node_leftovers.hold_cgroup(group, name)
            if profile.network == NetworkMode.TRIAL:
                tunnel = None
                if num_nodes > 1:
                    tunnel = trial_tunnel.plan(attempt_id, node_ips, node_ip)
                network, relay = _trial_network(attempt_id, env, tunnel, holds)
            if profile.denied_syscalls:
                fd = seccomp.filter_fd(profile.denied_syscalls)
            return cls(profile, group, network, relay, fd, holds)
        except (OSError, RuntimeError) as exc:
            if relay is not None:
                relay.close()
            if group is not None:
                group.remove(timeout_s=0)
            for hold in holds.values():
                hold.release()
            raise ContainmentError(f"cannot contain rank {rank}: {exc}") from exc

    def sandbox_plan(self, plan: SandboxPlan) -> SandboxPlan:
        """``plan`` with this profile and filter (bwrap applies namespaces, tmpfs, seccomp)."""
        return dataclasses.replace(plan, profile=self.profile, seccomp_fd=self._seccomp_fd)

    def pass_fds(self) -> tuple[int, ...]:
        """Descriptors the rank's bwrap must inherit (the seccomp program)."""
        return (self._seccomp_fd,) if self._seccomp_fd is not None else ()

    def cgroup_procs(self) -> list[str]:
        """The files a process of the rank writes to, to join its cgroup (none: no cgroup)."""
        return self.cgroup.procs_files() if self.cgroup is not None else []

    def seccomp_program(self) -> bytes | None:
        """The filter's program, for a rank that installs it itself (warm_sandbox.py)."""
        denied = self.profile.denied_syscalls
        return seccomp.compiled_filter(denied) if denied else None

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

    def traffic(self) -> NamespaceSample | None:
        """The byte counters of the trial's namespace on this node now (None: it has none)."""
        fd, network = self._netns_fd, self.network
        if fd is None or network is None:
            return None
        try:
            interfaces = trial_traffic.read_namespace(fd)
        except OSError:
            return None
        relay = self._relay.bytes if self._relay is not None else 0
        return NamespaceSample(network.name, tuple(sorted(interfaces.items())), relay)

    def cpu_time_s(self) -> float:
        return self.cgroup.cpu_time_s() if self.cgroup is not None else 0.0

    def remove(self, *, last_on_node: bool) -> None:
        """Release the relay and the cgroup; the network's name too when no rank of the node
        holds it any more (``last_on_node`` decides where nothing holds it)."""
        self.started()
        if self._relay is not None:
            self._relay.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self._netns_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._netns_fd)
            self._netns_fd = None
        if self.cgroup is not None and "cgroup" in self._holds:
            removed = not any(f.exists() for f in self.cgroup.folders())
            self._holds.pop("cgroup").release(removed=removed)
        if self.network is not None:
            hold = self._holds.pop("network", None)
            last = hold.last() if hold is not None else last_on_node
            if last:
                self.network.remove()
            if hold is not None:
                hold.release(removed=last)


def _trial_network(
    attempt_id: str,
    env: MutableMapping[str, str],
    tunnel: trial_tunnel.TunnelPlan | None,
    holds: dict[str, node_leftovers.Hold],
) -> tuple[trial_network.TrialNetwork, trial_network.ApiRelay | None]:
    """The attempt's namespace on this node, and the API relay if this rank serves it."""
    name = trial_network.namespace_name(attempt_id)
    then = None
    if tunnel is not None:  # one end of the tunnel per node: the name says which node
        name = trial_network.namespace_name(f"{attempt_id}-n{tunnel.node_index}")

        def then(network: trial_network.TrialNetwork) -> None:
            trial_tunnel.add_tunnel(network, tunnel)

    holds["network"] = node_leftovers.hold_network(trial_network.TrialNetwork(name))
    relay = None
    if not env.get(API_URL_ENV):  # a launch without the control plane (benchmarks, tests)
        network = trial_network.TrialNetwork.ensure(name, [], then=then)
    else:
        url = urlsplit(env[API_URL_ENV])
        if not url.hostname or url.scheme not in ("http", "https"):
            raise ContainmentError(f"{API_URL_ENV} is not an http(s) URL: {env[API_URL_ENV]!r}")
        port = url.port or (443 if url.scheme == "https" else 80)
        address = _resolve(url.hostname)
        network = trial_network.TrialNetwork.ensure(name, [address], then=then)
        try:
            relay = trial_network.ApiRelay(network, (address, port), (url.hostname, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:  # in use: another rank of the node relays
                raise
        if address != url.hostname:  # no name service in the namespace: name the address
            netloc = f"{address}:{port}" if url.port else address
            env[API_URL_ENV] = urlunsplit(url._replace(netloc=netloc))
    if tunnel is None:  # the ranks of the trial on this node rendezvous on its loopback
        env["MASTER_ADDR"] = "127.0.0.1"
        env["GLOO_SOCKET_IFNAME"] = "lo"
        env["NCCL_SOCKET_IFNAME"] = "lo"
    else:  # across nodes: on the tunnel, rank 0's node first
        env["MASTER_ADDR"] = trial_tunnel.address_of(0)
        env["GLOO_SOCKET_IFNAME"] = trial_tunnel.INTERFACE
        env["NCCL_SOCKET_IFNAME"] = trial_tunnel.INTERFACE
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
    tunnel_why = None if network_why else trial_tunnel.tunnel_problem()
    if tunnel_why:
        warnings.append(f"trials that span nodes keep the node's network: {tunnel_why}")
    seccomp_why = None
    try:
        seccomp.compiled_filter(DENIED_SYSCALLS)
    except seccomp.SeccompUnavailable as exc:
        seccomp_why = str(exc)
        warnings.append(f"ranks run without a seccomp filter: {exc}")
    node = NodeIsolation(
        cgroups=cgroup_why is None,
        network=network_why is None,
        cross_node=network_why is None and tunnel_why is None,
        seccomp=seccomp_why is None,
        pids_per_rank=pids_per_rank,
    )
    return node, warnings
