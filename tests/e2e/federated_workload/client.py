"""The example's client (examples/federated/client.py, copied beside this file as
``federated_example.py`` when the test packs its context) with what the tests need on top: a
client that kills itself once mid-round, a pause per round, and a probe of what data its
sandbox shows it."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
from federated_example import Client

from trainhub.runtime import federated


class TestClient(Client):  # type: ignore[misc]
    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> Any:
        out = super().fit(parameters, config)
        self.maybe_die(config)
        return out

    def maybe_die(self, config: dict[str, Any]) -> None:
        """A client killed mid-round (SIGKILL of its own process) once, when the test asks;
        a pause per round where it asks for one (so that a kill from outside lands)."""
        time.sleep(float(self.data.hparams.get("sleep_s", 0.0)))
        when = self.data.hparams.get("kill_client")  # "CLIENT:ROUND"
        if not when:
            return
        client, round_no = (int(v) for v in str(when).split(":"))
        marker = os.path.join(os.environ["HOME"], "killed-once")
        mine = self.data.client == client and int(config["round"]) == round_no
        if mine and not os.path.exists(marker):
            with open(marker, "w"):
                pass
            print(f"KILLING client {client} in round {round_no}", flush=True)
            os.kill(os.getpid(), 9)


def probe() -> None:
    """What of the data this client can see: its partition folder, and every x.npy or
    indices.npy anywhere in its sandbox (outside the Python installation)."""
    folder = os.environ["TRAINHUB_FEDERATED_PARTITION"]
    indices = np.load(os.path.join(folder, "indices.npy"))
    print(f"PARTITION {folder} {json.dumps(indices.tolist())}", flush=True)
    skip = {"/proc", "/sys", "/dev", sys.prefix, sys.base_prefix, "/usr", "/lib", "/lib64"}
    found = []
    for root, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
        found += [os.path.join(root, f) for f in files if f in ("x.npy", "indices.npy")]
    print(f"SEEN {json.dumps(sorted(found))}", flush=True)


if __name__ == "__main__":
    if os.environ.get("TRAINHUB_FEDERATED_PROBE"):
        probe()
    federated.start_client(TestClient)
