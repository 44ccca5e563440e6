"""Compress a registered model as a trial: ``trainhub compress`` submits this script.

    python -m trainhub.jobs.compress --arch '{"zoo": "lenet5", "args": {}}' \\
        --prune 0.5 [--structured] --quantize int8 --finetune-epochs 1 [--data mnist]

Managed (submitted by ``trainhub compress``): the weights come from the spec's
``model.init_from`` through ``ctx.init_model``; the result is saved as the trial's checkpoint
(``{"model": pruned float state dict, "onnx_int8": the int8 ONNX file as a uint8 tensor,
"arch": ...}``) with size, accuracy and latency as its metrics, which the CLI registers as the
model's next version. Standalone: ``--init-from PATH`` and ``--out DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

import trainhub
from trainhub import data, models
from trainhub.models import compress


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainhub.jobs.compress")
    parser.add_argument("--arch", required=True, help="JSON: {zoo, args, input}")
    parser.add_argument("--prune", type=float, default=0.5)
    parser.add_argument("--structured", action="store_true")
    parser.add_argument("--quantize", default="int8", choices=["int8", "none"])
    parser.add_argument("--finetune-epochs", type=int, default=1)
    parser.add_argument("--data", default="auto", help="mnist | digits | auto (by input shape)")
    parser.add_argument("--max-train", type=int, default=4000)
    parser.add_argument("--init-from", default=None, help="standalone: a checkpoint file")
    parser.add_argument("--out", default=None, help="standalone: where to write the result")
    parser.add_argument("--latency-repeats", type=int, default=300)
    return parser.parse_args(argv)


def choose_data(name: str, arch: dict[str, Any]) -> data.Splits:
    shape = tuple(arch.get("input") or ())
    if name == "auto":
        name = "digits" if shape == (1, 8, 8) else "mnist"
    return data.load(name)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    arch = json.loads(args.arch)
    ctx = trainhub.init()
    with ctx:
        model = models.create(arch["zoo"], **(arch.get("args") or {}))
        model, report = ctx.init_model(model, init_from=args.init_from)
        if not report.matched:
            raise SystemExit(f"compress: no weights were loaded ({report})")
        splits = choose_data(args.data, arch)
        train = compress.as_arrays(splits.train, args.max_train)
        val = compress.as_arrays(splits.val)
        with tempfile.TemporaryDirectory(prefix="trainhub-compress-") as work:
            result = compress.compress(
                model,
                train=train,
                val=val,
                prune_amount=args.prune,
                structured=args.structured,
                quantize=args.quantize,
                finetune_epochs=args.finetune_epochs,
                workdir=Path(work),
                latency_repeats=args.latency_repeats,
            )
        state: dict[str, Any] = {"model": result.model.state_dict(), "arch": arch}
        if result.onnx_int8 is not None:
            state["onnx_int8"] = torch.from_numpy(
                np.frombuffer(result.onnx_int8, dtype=np.uint8).copy()
            )
        metrics = {**result.metrics, "prune": args.prune}
        ctx.report(step=0, **metrics)
        handle = ctx.save_checkpoint(state, step=0, metrics=metrics)
        if handle is not None and ctx.managed:
            handle.wait()
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            torch.save(state, out / "compressed.pt")
            if result.onnx_int8 is not None:
                (out / "model-int8.onnx").write_bytes(result.onnx_int8)
            (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(json.dumps(metrics), flush=True)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
