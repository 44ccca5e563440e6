"""Reports a few points, says "ready", then trains (sleeps) until it is terminated."""

import time

import trainhub

ctx = trainhub.init()
for step in range(5):
    ctx.report(step=step, loss=1.0 / (step + 1))
print("ready", flush=True)
while True:
    time.sleep(0.05)
