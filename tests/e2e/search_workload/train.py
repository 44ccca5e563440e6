"""A tiny trial for search tests: its accuracy curve is set by the hyperparameter ``q``."""

import time

import trainhub

ctx = trainhub.init()
state = ctx.restore()
start = state["step"] + 1 if state else 1
for step in range(start, ctx.hparams["steps"] + 1):
    time.sleep(ctx.hparams.get("sleep_s", 0.3))
    ctx.report(step=step, acc=ctx.hparams["q"] * (1 - 0.5**step))
    ctx.save_checkpoint({"step": step}, step=step)
    stop = ctx.should_stop()
    if stop:
        print(f"STOPPED at step {step}", flush=True)
        break
ctx.close()
