"""What ``ctx.watch`` (layer health) costs per training step, measured (issue 11, item 3).

LeNet-5 and a 3-layer MLP on scikit-learn's digits (upscaled to 28x28 for LeNet), one CPU
thread, SGD. Two copies of the same model train side by side in alternating blocks of
``every`` steps (one sample per block), one watched and one not, so load on the machine hits
both alike; times are this process' CPU time (other processes' load moves them less than wall
time). The overhead is the median over rounds of (watched block / plain block - 1). One JSON
line per model and sampling period:
``{"benchmark": "watch_overhead", "model", "every", "overhead", "plain_step_ms",
"sampled_step_ms"}`` (``sampled_step_ms``: the extra time of one sampled step, from the same
blocks). Target: a small fraction at ``every`` >= 100.

    HOME=$(mktemp -d) nice -n 10 .venv/bin/python benchmarks/debug_layers.py [--rounds 21]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402  (after sys.path)
from torch import nn  # noqa: E402

from trainhub.models.lenet import LeNet5  # noqa: E402
from trainhub.runtime.layer_watch import LayerWatch  # noqa: E402

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def digits(batch: int, image_size: int | None) -> Batches:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1)
    x = (x - x.mean()) / x.std()
    x = nn.functional.interpolate(x, size=image_size) if image_size is not None else x.flatten(1)
    y = torch.tensor(bunch.target)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x) - batch + 1, batch)]


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def stepper(model: nn.Module, batches: Batches) -> Callable[[int], float]:
    """A function running ``n`` training steps and returning the seconds they took."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    position = 0

    def run(n: int) -> float:
        nonlocal position
        start = time.process_time()
        for _ in range(n):
            x, y = batches[position % len(batches)]
            position += 1
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return time.process_time() - start

    return run


def measure(
    name: str, make: Callable[[], nn.Module], batches: Batches, every: int, rounds: int
) -> dict[str, object]:
    torch.manual_seed(0)
    plain_model = make()
    watched_model = copy.deepcopy(plain_model)
    samples = 0

    def count(step: int, values: dict[str, float]) -> None:
        nonlocal samples
        samples += 1

    LayerWatch(watched_model, every=every, report=count)
    plain, watched = stepper(plain_model, batches), stepper(watched_model, batches)
    block = every
    plain(block)  # warm up both (allocator, kernels)
    watched(block)
    ratios, plain_s, extra_s = [], [], []
    for r in range(rounds):
        # alternate the order too, so neither copy always runs first
        if r % 2:
            w, p = watched(block), plain(block)
        else:
            p, w = plain(block), watched(block)
        ratios.append(w / p - 1)
        plain_s.append(p / block)
        extra_s.append((w - p) / (block / every))
    assert samples >= rounds, samples
    return {
        "benchmark": "watch_overhead",
        "model": name,
        "every": every,
        "overhead": round(statistics.median(ratios), 4),
        "plain_step_ms": round(statistics.median(plain_s) * 1000, 3),
        "sampled_step_ms": round(statistics.median(extra_s) * 1000, 3),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--every", type=int, nargs="+", default=[10, 100])
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [
        ("lenet5", LeNet5, digits(64, 28)),
        ("mlp", mlp, digits(64, None)),
    ]
    for name, make, batches in cases:
        for every in args.every:
            print(json.dumps(measure(name, make, batches, every, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
