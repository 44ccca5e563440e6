"""Why parallel multipart is not faster than one PUT here: SeaweedFS's CPU, measured (issue 25).

For each SeaweedFS layout (``single``: the test fixture's ``weed server``, one data folder;
``multi``: the same with four data folders, ``-volume.max`` 8 each and a 1 MiB
``-master.volumeSizeLimitMB`` floor raised so that writes spread over many volumes) and each
transfer of the same ``--mib`` bytes (one sequential PUT, then multipart uploads of several
part sizes and concurrencies through the S3 artifact store), one JSON line::

    {"benchmark": "s3_probe", "layout": ..., "transfer": "put" | "multipart", "part_mib": ...,
     "concurrency": ..., "mib_s": ..., "weed_cpu_s_per_100mib": ..., "weed_cores_used": ...,
     "client_cpu_s_per_100mib": ..., "machine_idle_pct": ..., "load1": ...}

``weed_cores_used`` is weed's CPU seconds over the transfer's wall seconds: the cores the
server actually got. ``machine_idle_pct`` is the whole machine's idle time (``/proc/stat``)
during the transfer. A server that is CPU-bound and gets no more cores from more streams
shows the same ``weed_cpu_s_per_100mib`` and ``weed_cores_used`` for every transfer, and a
rate that follows them, whatever the part size or concurrency.

    HOME=$(mktemp -d) .venv/bin/python benchmarks/s3_probe.py [--mib 256] [--layouts single,multi]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tests.fixtures.seaweedfs import SeaweedS3  # noqa: E402  (needs sys.path)

MIB = 1 << 20
TRANSFERS = [("put", 0, 1), ("multipart", 8, 4), ("multipart", 8, 8), ("multipart", 16, 2)]


class MultiVolume(SeaweedS3):
    """``weed server`` with four data folders and room for 8 volumes in each."""

    def command(self, weed: str) -> list[str]:
        args = super().command(weed)
        dirs = [self.workdir / f"data{i}" for i in range(4)]
        for folder in dirs:
            folder.mkdir(exist_ok=True)
        swapped = {
            "-dir": "-dir=" + ",".join(str(d) for d in dirs),
            "-volume.max": "-volume.max=" + ",".join("8" for _ in dirs),
            "-master.volumeSizeLimitMB": "-master.volumeSizeLimitMB=64",
        }
        return [swapped.get(arg.split("=", 1)[0], arg) for arg in args]


def _idle() -> tuple[float, float]:
    times = psutil.cpu_times()
    return times.idle + getattr(times, "iowait", 0.0), sum(times)


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def measure(seaweed: SeaweedS3, layout: str, source: Path, size: int) -> None:
    assert seaweed.proc is not None
    weed = psutil.Process(seaweed.proc.pid)
    me = psutil.Process()
    for transfer, part_mib, concurrency in TRANSFERS:
        store = seaweed.store(
            **(
                {}
                if transfer == "put"
                else {"part_bytes": part_mib * MIB, "concurrency": concurrency}
            )
        )
        idle0, total0 = _idle()
        weed0, me0 = _cpu(weed), _cpu(me)
        started = time.monotonic()
        with source.open("rb") as body:
            if transfer == "put":
                store.client.put_object(
                    Bucket=store.bucket,
                    Key=f"{store.prefix}/probe.bin",
                    Body=body,
                    ContentLength=size,
                )
            else:
                store.put_file("probe.bin", body)
        wall = time.monotonic() - started
        weed_s, me_s = _cpu(weed) - weed0, _cpu(me) - me0
        idle1, total1 = _idle()
        per = size / (100 * MIB)
        print(
            json.dumps(
                {
                    "benchmark": "s3_probe",
                    "layout": layout,
                    "transfer": transfer,
                    "part_mib": part_mib or None,
                    "concurrency": concurrency,
                    "mib_s": round(size / MIB / wall, 1),
                    "weed_cpu_s_per_100mib": round(weed_s / per, 2),
                    "weed_cores_used": round(weed_s / wall, 2),
                    "client_cpu_s_per_100mib": round(me_s / per, 2),
                    "machine_idle_pct": round(
                        100 * (idle1 - idle0) / max(1e-9, total1 - total0), 1
                    ),
                    "load1": round(os.getloadavg()[0], 1),
                }
            ),
            flush=True,
        )
        if transfer == "put":
            store.client.delete_object(Bucket=store.bucket, Key=f"{store.prefix}/probe.bin")
        else:
            store.delete("probe.bin")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--layouts", default="single,multi")
    args = parser.parse_args()
    size = args.mib * MIB
    with tempfile.TemporaryDirectory(prefix="trainhub-s3-probe-") as tmp:
        work = Path(tmp)
        source = work / "probe.bin"
        block = os.urandom(MIB)
        with source.open("wb") as out:
            for _ in range(args.mib):
                out.write(block)
        for layout in args.layouts.split(","):
            folder = work / layout
            folder.mkdir()
            seaweed = (MultiVolume if layout == "multi" else SeaweedS3)(folder)
            seaweed.start()
            os.environ.update(seaweed.env)
            try:
                measure(seaweed, layout, source, size)
            finally:
                seaweed.stop()


if __name__ == "__main__":
    main()
