"""A trial script that tries to reach what a tenant must not, and reports each try.

It runs as a real trial (tests/e2e/test_isolation.py, benchmarks/isolation.py). The test passes
what to aim at through the spec's ``environment`` (``ESCAPE_*``: paths of the control plane's
home, database, storage root, Ray's session folder, the server's pid, another trial's id). Each
attempt prints one line ``ESCAPE {"attempt": ..., "allowed": bool, "detail": ...}``; the script
exits 0 whatever it found, after saving a file in TRAINHUB_CHECKPOINT_DIR (which must work).
"""

from __future__ import annotations

SCRIPT = r'''
import glob, json, os, signal, sys, urllib.request, urllib.error
print("WARM_START", "torch" in sys.modules, flush=True)  # forked from the zygote (ADR 0048)

E = os.environ
results = []


def report(attempt, allowed, detail=""):
    line = {"attempt": attempt, "allowed": bool(allowed), "detail": str(detail)[:200]}
    print("ESCAPE " + json.dumps(line), flush=True)


def can_read(path):
    """True when any byte of path (a file) or any entry (a folder) can be read."""
    try:
        if os.path.isdir(path):
            os.listdir(path)
            return True
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False


def try_read(attempt, path):
    report(attempt, can_read(path), path)


home = E["ESCAPE_HOME"]
try_read("read_admin_token", os.path.join(home, "admin-token"))
try_read("read_database_file", E["ESCAPE_DB"])
try_read("list_control_plane_home", home)
try_read("list_storage_root", E["ESCAPE_STORAGE"])
try_read("list_other_trials_checkpoints", E["ESCAPE_CHECKPOINT_ROOT"])
try_read("list_node_work_root", E["ESCAPE_WORK_ROOT"])
try_read("list_ray_session_folder", E["ESCAPE_RAY_TEMP"])
try_read("read_ray_token_file", E["ESCAPE_RAY_TOKEN_FILE"])
try_read("read_etc_shadow", "/etc/shadow")
try_read("list_ray_folder_in_user_home", E["ESCAPE_RAY_USER_DIR"])

# the cluster token in any environment this process can see
env_token = "RAY_AUTH_TOKEN" in E or any(k.startswith("RAY_") for k in E)
report("ray_token_in_environment", env_token, sorted(k for k in E if k.startswith("RAY_")))
leaked = sorted(k for k in E if k in ("ESCAPE_CANARY",) or k.startswith("CANARY"))
report("server_environment_inherited", leaked, leaked)
others = []
for path in glob.glob("/proc/[0-9]*/environ"):
    pid = int(path.split("/")[2])
    if pid == os.getpid():
        continue
    try:
        data = open(path, "rb").read()
    except OSError:
        continue
    if b"RAY_" in data or b"TRAINHUB_TOKEN" in data:
        others.append(pid)
report("read_other_processes_environment", others, others)

pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
report("see_other_processes", len(pids) > 8, f"{len(pids)} pids visible")
server_pid = int(E["ESCAPE_SERVER_PID"])
try:
    os.kill(server_pid, 0)
    allowed = True
except ProcessLookupError:
    allowed = False
except PermissionError:
    allowed = False
report("signal_control_plane", allowed, server_pid)

# the trial token: scoped to this trial
api, token = E["TRAINHUB_API_URL"], E["TRAINHUB_TOKEN"]
print("TRIAL_TOKEN " + token, flush=True)


def get(path):
    request = urllib.request.Request(api + path, headers={"Authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


other = E["ESCAPE_OTHER_TRIAL"]
status = get(f"/api/v1/trials/{other}/signals")
report("trial_token_reads_other_trial", status < 400, status)
status = get("/api/v1/users")
report("trial_token_lists_users", status < 400, status)
own = get(f"/api/v1/trials/{E['TRAINHUB_TRIAL_ID']}/signals")
print(f"OWN_SIGNALS {own}", flush=True)

# what a trial may do: write its checkpoint folder
with open(os.path.join(E["TRAINHUB_CHECKPOINT_DIR"], "state.txt"), "w") as f:
    f.write("saved")
print("ESCAPES DONE", flush=True)
'''


def parse(log: str) -> dict[str, dict[str, object]]:
    """attempt -> its report, from a rank's log."""
    import json

    found = {}
    for line in log.splitlines():
        if line.startswith("ESCAPE "):
            item = json.loads(line[len("ESCAPE ") :])
            found[str(item["attempt"])] = item
    return found


# --- containment (issue 24): what a rank may use of the node, and what it may connect to ---

ATTACKS = r"""
import ctypes, errno, json, os, socket, subprocess, sys, time

E = os.environ
libc = ctypes.CDLL(None, use_errno=True)


def report(attempt, allowed, detail=""):
    line = {"attempt": attempt, "allowed": bool(allowed), "detail": str(detail)[:200]}
    print("ESCAPE " + json.dumps(line), flush=True)


def connect(attempt, address):
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect(address)
        report(attempt, True, f"connected to {address!r}")
    except OSError as exc:
        report(attempt, False, f"{address!r}: {exc}")
    finally:
        sock.close()


def fork_many(count):
    children = []
    try:
        for _ in range(count):
            children.append(subprocess.Popen(["sleep", "30"]))
        report("fork_300", True, f"{len(children)} processes")
    except OSError as exc:
        report("fork_300", False, f"stopped at {len(children)}: {exc}")
    finally:
        for child in children:
            child.kill()
            child.wait()


def fill_shm(limit_mib):
    written = 0
    try:
        with open("/dev/shm/fill", "wb") as f:
            chunk = b"x" * (1 << 20)
            while written < limit_mib:
                f.write(chunk)
                f.flush()
                written += 1
        report("fill_dev_shm", True, f"{written} MiB written")
    except OSError as exc:
        report("fill_dev_shm", False, f"stopped at {written} MiB: {exc}")
    finally:
        try:
            os.unlink("/dev/shm/fill")
        except OSError:
            pass


def syscall(attempt, number, *args):
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    code = ctypes.get_errno() if result < 0 else 0
    # EPERM is the filter's answer; any other outcome means the kernel got to decide
    report(attempt, result >= 0 or code != errno.EPERM, f"result {result} errno {code}")


fork_many(300)
fill_shm(int(E["ATTACK_SHM_MIB"]))
host, port = E["ATTACK_STORE"].rsplit(":", 1)
connect("connect_other_trials_store", (host, int(port)))
connect("connect_other_trials_store_loopback", ("127.0.0.1", int(port)))
ray_host, ray_port = E["ATTACK_RAY"].rsplit(":", 1)
connect("connect_ray_gcs", (ray_host, int(ray_port)))
connect("connect_ray_gcs_loopback", ("127.0.0.1", int(ray_port)))
connect("connect_postgres", ("127.0.0.1", 5432))
connect("connect_host_abstract_socket", "\0" + E["ATTACK_ABSTRACT"])
done = subprocess.run(["unshare", "-U", "-r", "true"], capture_output=True, text=True)
report("user_namespace_unshare", done.returncode == 0, done.stderr.strip())
CLONE_NEWUSER = 0x10000000
result = libc.unshare(CLONE_NEWUSER)
report("user_namespace_syscall", result == 0, f"errno {ctypes.get_errno()}")
syscall("keyctl", 250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
syscall("ptrace_attach_parent", 101, 16, os.getppid(), 0, 0)  # PTRACE_ATTACH, not a child
syscall("ptrace_seize_parent", 101, 0x4206, os.getppid(), 0, 0)  # PTRACE_SEIZE
cgroups = ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/cgroup.controllers")
report("sys_cgroup_visible", any(os.path.exists(p) for p in cgroups), os.listdir("/sys"))
report("sys_net_visible", os.path.exists("/sys/class/net"), "")
print("ATTACKS DONE", flush=True)
"""

ALLOCATE = r"""
import os, time
chunks = []
for i in range(int(os.environ["ATTACK_ALLOCATE_MIB"]) // 64):
    chunks.append(bytearray(64 << 20))  # zero-filled: every page touched
    print(f"allocated {(i + 1) * 64} MiB", flush=True)
print("ALLOCATED ALL", flush=True)
"""

BUSY = r"""
import os, time
seconds, workers = float(os.environ["ATTACK_BUSY_S"]), int(os.environ["ATTACK_BUSY_WORKERS"])
start = time.monotonic()
pids = []
for _ in range(workers):
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
wall = time.monotonic() - start
times = os.times()
print(f"BUSY cpu_s={times.children_user + times.children_system:.3f} wall_s={wall:.3f}", flush=True)
"""

NEIGHBOUR = r"""
import os, time
import torch
import torch.distributed as dist
import trainhub

ctx = trainhub.init()
print(f"STORE {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
steps = int(os.environ["NEIGHBOUR_STEPS"])
x = torch.ones(256, 256)
for step in range(steps):
    began = time.perf_counter()
    for _ in range(int(os.environ.get("NEIGHBOUR_WORK", "20"))):
        y = x @ x
    dist.all_reduce(y)
    elapsed = time.perf_counter() - began
    ctx.report(step=step, step_time_s=elapsed, value=float(step), at=time.time())
    time.sleep(float(os.environ.get("NEIGHBOUR_SLEEP_S", "0.2")))
print("NEIGHBOUR DONE", flush=True)
"""
