"""Reads its dataset mounts through trainhub.data.mounted, as a script must where ranks run
without a sandbox (the mount path is then a folder of the node's cache)."""

import sys

from trainhub.data.mounted import mounted_path

for mount in sys.argv[1:]:
    path = mounted_path(mount)
    print("READ", mount, (path / "greeting.txt").read_text().strip(), "FROM", path, flush=True)
