"""What a hostile tenant writes from inside its trial (issue 24), chosen by ATTACK:

- disk: 40 MiB straight into the checkpoint folder and 40 MiB into its home, then reports
  until the runtime raises QuotaExceeded (printed as ``QUOTA <message>``) and waits to be
  stopped;
- log: 3 MB of numbered lines, then ``LAST LINE``;
- metrics: 3,000 points as fast as it can, then close() (the runtime backs off on 429);
- quiet: the neighbour: 20 points, one every 0.2 s;
- steps: a neighbour that times STEPS steps of fixed CPU work (``step_s``; benchmarks).
"""

import os
import sys
import time

import trainhub
from trainhub.runtime import QuotaExceeded

ctx = trainhub.init()
attack = os.environ["ATTACK"]

if attack == "disk":
    block = os.urandom(1 << 20)
    for folder in (os.environ["TRAINHUB_CHECKPOINT_DIR"], os.environ["HOME"]):
        with open(os.path.join(folder, "fill.bin"), "wb") as out:
            for _ in range(40):
                out.write(block)
    print("WROTE 80 MiB", flush=True)
    deadline = time.time() + 150
    step = 0
    while time.time() < deadline:
        try:
            ctx.report(step=step, filler=1.0)
        except QuotaExceeded as exc:
            print(f"QUOTA {exc}", flush=True)
            break
        step += 1
        time.sleep(0.5)
    while time.time() < deadline and not ctx.should_stop():
        time.sleep(0.5)
    print("STOPPED", flush=True)
elif attack == "log":
    for i in range(30_000):
        sys.stdout.write(f"line {i:07d} " + "x" * 87 + "\n")
    sys.stdout.write("LAST LINE\n")
    sys.stdout.flush()
elif attack == "metrics":
    for step in range(3000):
        ctx.report(step=step, loss=1.0 / (step + 1))
    delivered = ctx.close(timeout_s=300)
    print(f"DELIVERED {delivered}", flush=True)
elif attack == "steps":
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    for step in range(int(os.environ.get("STEPS", "40"))):
        started = time.perf_counter()
        for _ in range(60):
            a = torch.tanh(a @ a / 256)
        ctx.report(step=step, step_s=time.perf_counter() - started)
    ctx.close(timeout_s=120)
else:
    for step in range(20):
        ctx.report(step=step, loss=1.0 / (step + 1))
        time.sleep(0.2)
    print("QUIET DONE", flush=True)
