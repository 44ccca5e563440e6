"""A tiny trial for search tests: its accuracy curve is set by the hyperparameter ``q``.

The first report of every attempt says which step it restored (``restored_from``, -1 for none)
and every report carries the ``q`` this process read from ``ctx.hparams``, so that tests check
restores and hyperparameters from recorded metrics rather than from logs.
"""

import time

import trainhub

ctx = trainhub.init()
state = ctx.restore()
start = state["step"] + 1 if state else 1
first = {"restored_from": state["step"] if state else -1, "attempt": ctx.attempt}
for step in range(start, ctx.hparams["steps"] + 1):
    time.sleep(ctx.hparams.get("sleep_s", 0.3))
    ctx.report(
        step=step, acc=ctx.hparams["q"] * (1 - 0.5**step), hparam_q=ctx.hparams["q"], **first
    )
    first = {}
    ctx.save_checkpoint({"step": step}, step=step)
    stop = ctx.should_stop()
    if stop:
        print(f"STOPPED at step {step}", flush=True)
        break
ctx.close()
