"""How benchmarks/models.py's transfer recipes were chosen: each variant on a validation split.

The validation images are 5-9 images of the *training* split that are not among the 250 a seed
picks (200 per class, drawn with seed ``1000 + seed``): disjoint from the samples both arms
train on and from the 5-9 images of the validation split the benchmark reports. The source
model, the 250 samples and the batch orders are the benchmark's (same seeds). A variant is a
JSON object; one JSON line per (variant, seed) with the validation accuracy after each epoch
in ``cps``::

    {"name": "scratch lr 1e-2", "arm": "scratch", "lr": 1e-2, "epochs": 40, "cps": [10, 20, 30, 40]}
    {"name": "warm", "arm": "warm", "lr": 1e-3, "body_lr": 3e-3, "probe": 5, "epochs": 40,
     "bn": "train" | "eval_probe" | "eval_all", "aug": false}

``bn``: the body's batch norm in train mode, in eval mode (the source's statistics) during
the probe, or throughout. ``aug``: random shifts of up to 2 pixels, the same for both arms.

    PYTHONPATH=src nice .venv/bin/python benchmarks/models_transfer_selection.py \
        --arch resnet20 --seeds 3 --variants variants.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models as bench
from trainhub.runtime.init_model import ModelPlan, initialize


def run_variant(
    variant: dict[str, Any],
    arch: str,
    source: nn.Module,
    train_set: bench.Arrays,
    seed: int,
    after_epoch: Callable[[int, nn.Module], None],
) -> None:
    xs, ys = train_set
    epochs, augment = int(variant["epochs"]), bool(variant.get("aug", False))
    torch.manual_seed(100 + seed)
    if variant["arm"] == "scratch":
        model = bench.build("mnist-t10k", 5, arch)
        bench.train(
            model,
            xs,
            ys,
            epochs=epochs,
            lr=variant["lr"],
            seed=seed,
            augment=augment,
            after_epoch=after_epoch,
        )
        return
    body, classifier = bench.parts(arch)
    model, _ = initialize(
        bench.build("mnist-t10k", 5, arch),
        ModelPlan(reset=(f"{classifier}.*",), freeze=tuple(f"{b}.*" for b in body)),
        weights=source.state_dict(),
    )
    norms = [
        m
        for n, m in model.named_modules()
        if n.split(".")[0] in body and isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    bn, probe = variant.get("bn", "train"), int(variant["probe"])
    bench.train(
        model,
        xs,
        ys,
        epochs=probe,
        lr=variant["lr"],
        seed=seed,
        augment=augment,
        after_epoch=after_epoch,
        eval_modules=norms if bn != "train" else (),
    )
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if n.split(".")[0] in body], "lr": variant["body_lr"]},
        {"params": [p for n, p in named if n.split(".")[0] not in body], "lr": variant["lr"]},
    ]
    bench.train(
        model,
        xs,
        ys,
        epochs=epochs - probe,
        lr=variant["lr"],
        seed=seed,
        groups=groups,
        first_epoch=probe + 1,
        augment=augment,
        after_epoch=after_epoch,
        eval_modules=norms if bn == "eval_all" else (),
    )


def recorder(
    checkpoints: set[int], held_out: bench.Arrays, into: dict[int, float]
) -> Callable[[int, nn.Module], None]:
    """An ``after_epoch`` that stores the held-out accuracy after each epoch of ``checkpoints``."""

    def after_epoch(epoch: int, model: nn.Module) -> None:
        if epoch in checkpoints:
            into[epoch] = bench.evaluate(model, *held_out)

    return after_epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="lenet5", choices=["lenet5", "resnet20"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--pretrain-epochs", type=int, default=10)
    parser.add_argument("--variants", required=True, help="a JSON file: a list of variants")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset, (x, y), _reported = bench.load_all()  # the reported split is never read here
    assert dataset == "mnist-t10k", "the selection ran on MNIST"
    variants = json.loads(Path(args.variants).read_text())
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        torch.manual_seed(seed)
        low = y < 5
        source = bench.train(
            bench.build(dataset, 5, args.arch),
            x[low],
            y[low],
            epochs=args.pretrain_epochs,
            lr=bench.PRETRAIN_LR,
            seed=seed,
        )
        picked = bench.pick(y, seed)
        rest = np.setdiff1d(np.flatnonzero(y >= 5), picked)
        rng = np.random.default_rng(1000 + seed)
        held_out = np.concatenate(
            [rng.choice(rest[y[rest] == c], 200, replace=False) for c in range(5, 10)]
        )
        xv, yv = x[held_out], y[held_out] - 5
        for variant in variants:
            started, accuracy = time.perf_counter(), {}
            checkpoints = set(variant.get("cps", [variant["epochs"]]))
            after_epoch = recorder(checkpoints, (xv, yv), accuracy)
            run_variant(variant, args.arch, source, (x[picked], y[picked] - 5), seed, after_epoch)
            line = {
                "arch": args.arch,
                "pretrain": args.pretrain_epochs,
                "seed": seed,
                "name": variant["name"],
                "val": {str(k): round(v, 4) for k, v in sorted(accuracy.items())},
                "s": round(time.perf_counter() - started, 1),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
