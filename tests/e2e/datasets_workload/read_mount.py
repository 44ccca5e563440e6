"""A trial that reads its dataset mounts and tries to change them (tests/e2e/test_datasets.py).

Prints READ <mount> <content of greeting.txt>, WRITE_REFUSED/WRITE_ALLOWED for each way of
changing the mount, and SEEN <entries of /data> so the test knows what else the trial sees."""

import errno
import os
import sys

mounts = sys.argv[1:]
for mount in mounts:
    with open(os.path.join(mount, "greeting.txt")) as handle:
        print("READ", mount, handle.read().strip(), flush=True)
    tries = {
        "create": lambda m: os.open(os.path.join(m, "new.txt"), os.O_WRONLY | os.O_CREAT),
        "overwrite": lambda m: os.open(os.path.join(m, "greeting.txt"), os.O_WRONLY),
        "remove": lambda m: os.remove(os.path.join(m, "greeting.txt")),
        "mkdir": lambda m: os.mkdir(os.path.join(m, "sub2")),
    }
    for name, attempt in tries.items():
        try:
            attempt(mount)
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, exc.errno)
            print("WRITE_REFUSED", mount, name, code, flush=True)
        else:
            print("WRITE_ALLOWED", mount, name, flush=True)
print("SEEN", sorted(os.listdir("/data")) if os.path.isdir("/data") else [], flush=True)
