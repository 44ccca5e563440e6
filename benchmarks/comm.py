"""Communication strategies on a rate-limited link between two hosts, against plain all-reduce.

Two network namespaces joined by a veth pair shaped to ``--rate`` (tc tbf, both directions) act
as two hosts, each a Ray node with one CPU; a 2-rank trial is placed across them (STRICT_SPREAD)
and trains, with gloo, the same model for the same number of epochs on the same MNIST split
under each strategy in turn, plain all-reduce first (the baseline, measured in the same run).
Models: an MLP of >= 10M parameters (communication-bound) and ResNet-20 (compute-bound).

One JSON line per (model, strategy): step time, samples/s, bytes per step (estimated bytes this
rank sends, ring algorithms), share of step time spent waiting on communication, validation
accuracy, and ratios against all-reduce; then one summary line per model naming the best
strategy that stays within 0.5 accuracy points of all-reduce. Timings are from the last epoch
(the steady state: warm-ups of PowerSGD/top-k/1-bit/local SGD fall in the first epoch); both
ranks share this machine's CPUs, so compute is slower than on two real hosts and the numbers
vary with the machine's load.

    sudo .venv/bin/python benchmarks/comm.py [--rate 1gbit] [--models mlp,resnet20] [--quick]

The learning rate follows a cosine from ``lr`` to 0 over the run (``--lr-schedule``): with a
constant rate the accuracy of the last iterate swings by several points between strategies that
send the same gradients to within rounding (bf16 and fp16 differed by 11 points on ResNet-20),
which says nothing about the strategies.

Needs root (namespaces) and the MNIST files of ../shared/data/mnist (or $TRAINHUB_DATA_DIR).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.distributed.netns import two_host_cluster, unavailable_reason  # noqa: E402

from trainhub.models.mlp import hidden_for_parameters  # noqa: E402

STRATEGY_NAMES = [
    "allreduce",
    "fp16",
    "bf16",
    "powersgd",
    "onebit",
    "topk",
    "localsgd",
    "localsgd-overlap",
    "ps",
]


def strategy_section(name: str, steps_per_epoch: int) -> dict[str, Any]:
    """The distributed section of each strategy; warm-ups end halfway through the first epoch,
    so the timed last epoch is the steady state."""
    warmup = max(2, steps_per_epoch // 2)
    sections: dict[str, dict[str, Any]] = {
        "allreduce": {"strategy": "allreduce"},
        "fp16": {"strategy": "fp16"},
        "bf16": {"strategy": "bf16"},
        "powersgd": {"strategy": "powersgd", "powersgd": {"rank": 4, "start_step": warmup}},
        "onebit": {"strategy": "onebit", "onebit": {"start_step": warmup}},
        "topk": {"strategy": "topk", "topk": {"density": 0.01, "warmup_steps": warmup}},
        "localsgd": {"strategy": "localsgd", "localsgd": {"period": 16, "start_step": warmup}},
        "localsgd-overlap": {
            "strategy": "localsgd",
            "localsgd": {"period": 16, "start_step": warmup, "overlap": True},
        },
        "ps": {"strategy": "ps", "ps": {"num_shards": 2, "consistency": "sync"}},
    }
    return sections[name]


def model_jobs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    width = hidden_for_parameters(784, 10, args.mlp_parameters)
    return {
        "mlp": {
            "model": "mlp",
            "model_kwargs": {"in_features": 784, "hidden": [width, width]},
            "train_size": args.mlp_train_size,
            "epochs": args.mlp_epochs,
            "lr": 0.05,
        },
        "resnet20": {
            "model": "resnet20",
            "model_kwargs": {"in_channels": 1},
            "train_size": args.resnet_train_size,
            "epochs": args.resnet_epochs,
            "lr": 0.05,
        },
    }


def line_for(
    result: dict[str, Any], job: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    last = result["epochs"][-1]
    return {
        "benchmark": "comm",
        "model": job["model_name"],
        "strategy": job["strategy"],
        "settings": job["distributed"],
        "num_parameters": result["num_parameters"],
        "link": f"veth between two network namespaces, tc tbf {args.rate} each way",
        "world_size": 2,
        "ranks_on": result["rank_nodes"],
        "dataset": f"MNIST t10k split {job['train_size']} train / {args.val_size} val",
        "epochs": job["epochs"],
        "batch_size_per_rank": job["batch_size"],
        "lr": job["lr"],
        "lr_schedule": job["lr_schedule"],
        "timing_window": f"last epoch ({int(last['time/num_steps'])} steps)",
        "step_s": round(last["time/step_s"], 4),
        "samples_per_s": round(last["throughput/samples_per_s"], 1),
        "bytes_per_step": round(last["comm/bytes_per_step"]),
        "sync_share": round(last["time/sync_share"], 4),
        "shares": {
            k.removeprefix("time/").removesuffix("_share"): round(v, 4)
            for k, v in last.items()
            if k.endswith("_share")
        },
        "accuracy": round(result["accuracy"], 4),
        "train_s": round(result["train_s"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--models", default="mlp,resnet20")
    parser.add_argument("--strategies", default=",".join(STRATEGY_NAMES))
    parser.add_argument(
        "--ps-models",
        default="resnet20",
        help="models that also run strategy ps (the 10M MLP pushes and pulls 80 MB per step)",
    )
    parser.add_argument("--mlp-parameters", type=int, default=10_000_000)
    parser.add_argument("--mlp-train-size", type=int, default=8000)
    parser.add_argument("--mlp-epochs", type=int, default=2)
    parser.add_argument("--resnet-train-size", type=int, default=4000)
    parser.add_argument("--resnet-epochs", type=int, default=3)
    parser.add_argument("--val-size", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument(
        "--lr-schedule",
        choices=["cosine", "constant"],
        default="cosine",
        help="cosine anneals the lr to 0 at the end, so the evaluated weights are not one noisy "
        "iterate of a high constant rate (constant: how runs before 2026-11-23 were measured)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a reduced run for iteration: 2,000 train images, 1 epoch per model",
    )
    args = parser.parse_args()
    if args.quick:
        args.mlp_train_size = args.resnet_train_size = 2000
        args.mlp_epochs = args.resnet_epochs = 1
    reason = unavailable_reason()
    if reason is not None:
        print(json.dumps({"benchmark": "comm", "skipped": reason}))
        return
    strategies = args.strategies.split(",")
    if strategies[0] != "allreduce":
        strategies = ["allreduce", *[s for s in strategies if s != "allreduce"]]
    base_jobs = model_jobs(args)
    jobs = []
    for model_name in args.models.split(","):
        base = base_jobs[model_name]
        steps_per_epoch = -(-base["train_size"] // (2 * args.batch_size))
        for strategy in strategies:
            if strategy == "ps" and model_name not in args.ps_models.split(","):
                continue
            job = {
                **base,
                "name": f"{model_name}/{strategy}",
                "model_name": model_name,
                "strategy": strategy,
                "dataset": "mnist",
                "val_size": args.val_size,
                "batch_size": args.batch_size,
                "distributed": strategy_section(strategy, steps_per_epoch),
                "lr_schedule": args.lr_schedule,
            }
            jobs.append(job)
    started = time.perf_counter()
    lines: list[dict[str, Any]] = []
    with two_host_cluster(rate=args.rate) as cluster:
        results = cluster.run_driver(
            ["-m", "tests.distributed.two_host", "--jobs", json.dumps(jobs)],
            timeout_s=3600,
            stream=True,
        )
    results = [r for r in results if r.get("event") == "result"]
    by_name = {r["name"]: r for r in results}
    for job in jobs:
        result = by_name.get(job["name"])
        if result is None:
            continue
        line = line_for(result, job, args)
        baseline = (
            next(x for x in lines if x["model"] == line["model"])
            if lines and any(x["model"] == line["model"] for x in lines)
            else line
        )
        line["samples_per_s_vs_allreduce"] = round(
            line["samples_per_s"] / baseline["samples_per_s"], 3
        )
        line["bytes_vs_allreduce"] = round(
            line["bytes_per_step"] / max(baseline["bytes_per_step"], 1), 5
        )
        line["accuracy_points_vs_allreduce"] = round(
            100 * (line["accuracy"] - baseline["accuracy"]), 2
        )
        lines.append(line)
        print(json.dumps(line), flush=True)
    for model_name in args.models.split(","):
        mine = [x for x in lines if x["model"] == model_name]
        if not mine:
            continue
        eligible = [x for x in mine[1:] if x["accuracy_points_vs_allreduce"] >= -0.5]
        best = max(eligible, key=lambda x: x["samples_per_s"], default=None)
        summary: dict[str, Any] = {
            "benchmark": "comm",
            "summary": model_name,
            "best_strategy_within_0.5_points": best["strategy"] if best else None,
            "wall_s": round(time.perf_counter() - started, 1),
        }
        if best is not None:
            summary.update(
                {
                    "speedup": best["samples_per_s_vs_allreduce"],
                    "accuracy_points_vs_allreduce": best["accuracy_points_vs_allreduce"],
                    "sync_share": best["sync_share"],
                    "target_speedup_3x_met": best["samples_per_s_vs_allreduce"] >= 3.0,
                    "target_sync_share_5pct_met": best["sync_share"] <= 0.05,
                }
            )
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
