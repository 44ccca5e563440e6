"""Short epochs for the first-day tests: ``q`` sets the accuracy curve, ``sleep_s`` the epoch.

Reports ``val_accuracy`` (the name a spec may misspell) after each epoch, then asks
``should_stop()`` and prints where it stopped, as a user's loop does.
"""

import time

import trainhub

ctx = trainhub.init()
for step in range(1, ctx.hparams["steps"] + 1):
    time.sleep(ctx.hparams["sleep_s"])
    ctx.report(step=step, val_accuracy=ctx.hparams["q"] * (1 - 0.5**step), train_loss=1.0 / step)
    if ctx.should_stop():
        print(f"STOPPED at step {step}: {ctx.stop_reason}", flush=True)
        break
ctx.close()
