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
