"""Hyperparameter search: efficiency of samplers x pruners, the search's overhead, ingestion.

All arms run in one invocation and print JSON lines (keys as issue 9 names them):

- ``hpo_efficiency`` (one line per arm: random, tpe, random+asha, tpe+asha): the same search
  space over an MLP on scikit-learn's digits (1,437 train / 360 validation images), ``--trials``
  trials of up to 27 epochs each, driven through trainhub's Optuna backend
  (``adapters/optuna_search.py``: ask, report per epoch, should_prune, tell) on an Optuna
  storage in SQLite. ``best_accuracy`` is the best validation accuracy any trial reached;
  ``trial_epochs`` the epochs trained in all. The ratios compare with random search without
  pruning in the same run (target: tpe+asha within 0.5 points with at most 0.35x the epochs).
- ``hpo_efficiency`` arm ``tpe+asha-served`` (``--only served``): the same MLP and space, but
  TPE+ASHA through the whole system: a control plane process (SQLite), the local Ray, and
  ``--served-trials`` real trial processes (``--served-concurrency`` at once) that train one
  epoch per ``--epoch-s`` seconds (padded with a sleep), report ``val_accuracy`` and stop on
  ``ctx.should_stop()``. ``trial_epochs`` counts the epochs the trials reported;
  ``epochs_vs_unpruned`` divides it by the epochs the same trials train unpruned (each runs all
  ``MAX_EPOCHS``: the script has no other way to end), target <= 0.5: it measures how soon a
  prune decided by the server stops a real trial (issue 31).
- ``hpo_overhead``: ``--overhead-trials`` trials of a short script (10 reports each) through
  the whole system (a control plane process, SQLite, the local Ray): trials finished per
  minute; and the backend's ask and prune-decision p99 with ``--history`` finished trials in
  the study (target < 50 ms at 1,000).
- ``ingestion``: metric points per second through the HTTP API from ``--reporters``
  concurrent reporters (target >= 50,000 points/s), as users run it: the server in its own
  process (SQLite, or ``--db postgresql://...``), each reporter a trial's runtime in its own
  process posting 10 batches of 1,000 points; ``rows_stored`` is counted after
  (``benchmarks/ingestion.py`` says more).

    HOME=$(mktemp -d) .venv/bin/python benchmarks/hpo.py [--trials 32] [--overhead-trials 200]
    HOME=$(mktemp -d) .venv/bin/python benchmarks/hpo.py --only ingestion [--db postgresql://...]
    HOME=$(mktemp -d) .venv/bin/python benchmarks/hpo.py --only served [--served-trials 14]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainhub.adapters.optuna_search import OptunaSearch  # noqa: E402
from trainhub.core.search_space import parse_space  # noqa: E402
from trainhub.service.search_ports import StudyConfig, TellState  # noqa: E402

MAX_EPOCHS = 27
SPACE = parse_space(
    {
        "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
        "hidden": {"type": "int", "low": 8, "high": 256, "log": True},
        "weight_decay": {"type": "float", "low": 1e-6, "high": 1e-1, "log": True},
        "batch_size": {"type": "categorical", "choices": [16, 32, 64, 128, 256]},
        "momentum": {"type": "float", "low": 0.0, "high": 0.99},
    }
)
ARMS = {
    "random": ("random", "none"),
    "tpe": ("tpe", "none"),
    "random+asha": ("random", "asha"),
    "tpe+asha": ("tpe", "asha"),
}


# ---------------------------------------------------------------- efficiency
class Digits:
    def __init__(self) -> None:
        import torch

        from trainhub.data.digits import load_digits

        splits = load_digits(val_fraction=0.2, seed=0)
        self.train_x, self.train_y = (t for t in splits.train.tensors)
        self.val_x, self.val_y = (t for t in splits.val.tensors)
        self.train_x = self.train_x.flatten(1)
        self.val_x = self.val_x.flatten(1)
        torch.set_num_threads(1)


def train_trial(data: Digits, params: dict[str, Any], seed: int, report: Any) -> tuple[float, int]:
    """Train epoch by epoch; ``report(epoch, acc)`` returns True to stop. Best acc, epochs."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(64, params["hidden"]), nn.ReLU(), nn.Linear(params["hidden"], 10)
    )
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=params["lr"],
        momentum=params["momentum"],
        weight_decay=params["weight_decay"],
    )
    generator = torch.Generator().manual_seed(seed)
    best, epochs = 0.0, 0
    n = len(data.train_x)
    for epoch in range(1, MAX_EPOCHS + 1):
        model.train()
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, params["batch_size"]):
            index = order[start : start + params["batch_size"]]
            loss = nn.functional.cross_entropy(model(data.train_x[index]), data.train_y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            acc = float((model(data.val_x).argmax(1) == data.val_y).float().mean())
        if not math.isfinite(acc):
            acc = 0.0
        best, epochs = max(best, acc), epoch
        if report(epoch, acc):
            break
    return best, epochs


def efficiency_arm(name: str, trials: int, seed: int, data: Digits, root: Path) -> dict[str, Any]:
    sampler, pruner = ARMS[name]
    backend = OptunaSearch.for_database(f"sqlite:///{root / f'{name}.db'}")
    study = StudyConfig(
        name=f"efficiency-{name}",
        direction="maximize",
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        min_budget=1,
        max_budget=MAX_EPOCHS,
        reduction_factor=3,
    )
    best, spent, pruned = 0.0, 0, 0
    started = time.perf_counter()
    for number in range(trials):
        asked = backend.ask(study, SPACE)
        stopped = [False]

        def report(
            epoch: int, acc: float, asked: Any = asked, stopped: list[bool] = stopped
        ) -> bool:
            backend.report(study, asked.backend_id, [(epoch, acc)])
            stopped[0] = pruner != "none" and backend.should_prune(study, asked.backend_id)
            return stopped[0]

        trial_best, epochs = train_trial(data, asked.params, seed * 1000 + number, report)
        spent += epochs
        best = max(best, trial_best)
        if stopped[0]:
            pruned += 1
            backend.tell(study, asked.backend_id, TellState.PRUNED, trial_best)
        else:
            backend.tell(study, asked.backend_id, TellState.COMPLETE, trial_best)
    backend.storage.engine.dispose()  # type: ignore[attr-defined]
    return {
        "benchmark": "hpo_efficiency",
        "arm": name,
        "best_accuracy": round(best, 4),
        "trial_epochs": spent,
        "trials": trials,
        "pruned": pruned,
        "wall_s": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------- decision latency
def decision_latency(
    history: int, samples: int, root: Path, sampler: str = "tpe"
) -> dict[str, float]:
    """Percentiles (ms) of ask and of a prune decision (report + should_prune) with ``history``
    trials done: wall time, and the CPU time of this thread (what the decision itself costs
    when other processes compete for the cores)."""
    import optuna

    backend = OptunaSearch.for_database(f"sqlite:///{root / f'latency-{sampler}.db'}")
    study = StudyConfig("latency", "maximize", sampler, "asha", seed=0, min_budget=1, max_budget=10)
    optuna_study = backend._study(study)
    rng = __import__("random").Random(0)
    distributions = {
        "lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True),
        "hidden": optuna.distributions.IntDistribution(8, 256, log=True),
        "weight_decay": optuna.distributions.FloatDistribution(1e-6, 1e-1, log=True),
        "batch_size": optuna.distributions.CategoricalDistribution([16, 32, 64, 128, 256]),
        "momentum": optuna.distributions.FloatDistribution(0.0, 0.99),
    }
    finished = []
    for _ in range(history):
        params = {
            "lr": math.exp(rng.uniform(math.log(1e-4), 0.0)),
            "hidden": rng.randint(8, 256),
            "weight_decay": math.exp(rng.uniform(math.log(1e-6), math.log(1e-1))),
            "batch_size": rng.choice([16, 32, 64, 128, 256]),
            "momentum": rng.uniform(0.0, 0.99),
        }
        quality = rng.random()
        curve = {step: quality * (1 - 0.5**step) for step in range(1, 11)}
        finished.append(
            optuna.trial.create_trial(
                params=params,
                distributions=distributions,
                value=curve[10],
                intermediate_values=curve,
            )
        )
    optuna_study.add_trials(finished)
    asks, prunes, ask_cpu, prune_cpu = [], [], [], []
    for _ in range(samples):
        began, cpu = time.perf_counter(), time.thread_time()
        asked = backend.ask(study, SPACE)
        asks.append(time.perf_counter() - began)
        ask_cpu.append(time.thread_time() - cpu)
        for step in range(1, 4):
            began, cpu = time.perf_counter(), time.thread_time()
            backend.report(study, asked.backend_id, [(step, rng.random())])
            backend.should_prune(study, asked.backend_id)
            prunes.append(time.perf_counter() - began)
            prune_cpu.append(time.thread_time() - cpu)
        backend.tell(study, asked.backend_id, TellState.PRUNED, None)
    backend.storage.engine.dispose()  # type: ignore[attr-defined]
    return {
        "ask_p50_ms": _pct(asks, 0.5),
        "ask_p99_ms": _pct(asks, 0.99),
        "ask_cpu_p99_ms": _pct(ask_cpu, 0.99),
        "prune_p50_ms": _pct(prunes, 0.5),
        "prune_p99_ms": _pct(prunes, 0.99),
        "prune_cpu_p99_ms": _pct(prune_cpu, 0.99),
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 1)


# ---------------------------------------------------------------- through the whole system
SHORT_SCRIPT = """
import trainhub
ctx = trainhub.init()
for step in range(10):
    ctx.report(step=step, loss=1.0 / (step + 1) * ctx.hparams["lr"])
ctx.close()
"""


def trials_per_minute(count: int, root: Path, budget_s: float) -> tuple[float, int]:
    from tests.fixtures.control_plane import ControlPlaneProcess

    from trainhub.adapters.ray_executor import ensure_local_ray, stop_local_ray

    workload = root / "short"
    workload.mkdir()
    (workload / "short.py").write_text(SHORT_SCRIPT)
    spec = f"""
name: overhead
entrypoint: python short.py
resources: {{cpus_per_worker: 1}}
hyperparameters: {{lr: {{type: float, low: 1.0e-3, high: 1.0, log: true}}}}
searcher: {{sampler: random, metric: loss, mode: min, max_trials: {count},
           max_concurrent_trials: 4}}
max_restarts: 0
"""
    address = ensure_local_ray(root / "ray", num_cpus=4)
    plane = ControlPlaneProcess(root / "plane", address, settings={"tick_interval_s": 0.5})
    (root / "plane").mkdir()
    plane.start()
    try:
        began = time.time()
        experiment = plane.submit(spec, workload)
        deadline = began + budget_s  # on a busy machine: the rate over what finished in time
        while time.time() < deadline:
            body = plane.request("GET", f"/experiments/{experiment['id']}").json()
            if body["state"] != "ACTIVE":
                break
            time.sleep(1.0)
        elapsed = time.time() - began
        done = sum(1 for t in body["trials"] if t["state"] == "COMPLETED")
    finally:
        plane.stop()
        stop_local_ray(root / "ray")
    return done / (elapsed / 60.0), done


SERVED_SCRIPT = """
import time

import torch
from torch import nn

import trainhub
from trainhub.data.digits import load_digits

ctx = trainhub.init()
hp = ctx.hparams
torch.manual_seed(hp["seed"])
torch.set_num_threads(1)
splits = load_digits(val_fraction=0.2, seed=0)
train_x, train_y = splits.train.tensors
val_x, val_y = splits.val.tensors
train_x, val_x = train_x.flatten(1), val_x.flatten(1)
model = nn.Sequential(nn.Linear(64, hp["hidden"]), nn.ReLU(), nn.Linear(hp["hidden"], 10))
optimizer = torch.optim.SGD(
    model.parameters(), lr=hp["lr"], momentum=hp["momentum"], weight_decay=hp["weight_decay"]
)
for epoch in range(1, hp["epochs"] + 1):
    began = time.monotonic()
    model.train()
    order = torch.randperm(len(train_x))
    for start in range(0, len(train_x), hp["batch_size"]):
        index = order[start : start + hp["batch_size"]]
        loss = nn.functional.cross_entropy(model(train_x[index]), train_y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(val_x).argmax(1) == val_y).float().mean())
    time.sleep(max(0.0, hp["epoch_s"] - (time.monotonic() - began)))  # a 1-second epoch
    ctx.report(step=epoch, val_accuracy=acc if acc == acc else 0.0)
    if ctx.should_stop():
        break
ctx.close()
"""


def served_arm(trials: int, concurrency: int, epoch_s: float, seed: int, root: Path) -> dict:
    """TPE+ASHA through a control plane and real trials (see the module docstring)."""
    from tests.fixtures.control_plane import ControlPlaneProcess

    from trainhub.adapters.ray_executor import ensure_local_ray, stop_local_ray

    workload = root / "served"
    workload.mkdir()
    (workload / "train.py").write_text(SERVED_SCRIPT)
    spec = f"""
name: hpo-served
entrypoint: python train.py
resources: {{cpus_per_worker: 1}}
hyperparameters:
  lr: {{type: float, low: 1.0e-4, high: 1.0, log: true}}
  hidden: {{type: int, low: 8, high: 256, log: true}}
  weight_decay: {{type: float, low: 1.0e-6, high: 1.0e-1, log: true}}
  batch_size: {{type: categorical, choices: [16, 32, 64, 128, 256]}}
  momentum: {{type: float, low: 0.0, high: 0.99}}
  epochs: {MAX_EPOCHS}
  epoch_s: {epoch_s}
  seed: {seed}
searcher: {{sampler: tpe, pruner: asha, metric: val_accuracy, mode: max, max_trials: {trials},
           max_concurrent_trials: {concurrency}, budget: {{min: 1, max: {MAX_EPOCHS}}},
           reduction_factor: 3, seed: {seed}}}
max_restarts: 0
"""
    address = ensure_local_ray(root / "ray-served", num_cpus=max(2, concurrency))
    (root / "plane-served").mkdir()
    plane = ControlPlaneProcess(root / "plane-served", address)
    plane.start()
    try:
        began = time.time()
        experiment_id = plane.submit(spec, workload)["id"]
        while True:
            body = plane.request("GET", f"/experiments/{experiment_id}").json()
            if body["state"] != "ACTIVE":
                break
            time.sleep(1.0)
        wall_s = time.time() - began
        epochs, best, past = [], 0.0, []
        for trial in body["trials"]:
            points = plane.metrics(trial["id"])
            steps = [p["step"] for p in points]
            epochs.append(max(steps) if steps else 0)
            best = max([best] + [p["values"].get("val_accuracy", 0.0) for p in points])
            if trial["state"] == "PRUNED":
                detail = plane.trial(trial["id"])
                said = [e["message"] for e in detail["events"] if e["kind"] == "prune"]
                found = re.search(r"at step (\d+)", said[0]) if said else None
                if found and steps:
                    past.append(max(steps) - int(found.group(1)))
        states = [t["state"] for t in body["trials"]]
    finally:
        plane.stop()
        stop_local_ray(root / "ray-served")
    spent = sum(epochs)
    return {
        "benchmark": "hpo_efficiency",
        "arm": "tpe+asha-served",
        "trial_epochs": spent,
        "unpruned_epochs": len(epochs) * MAX_EPOCHS,
        "epochs_vs_unpruned": round(spent / (len(epochs) * MAX_EPOCHS), 3),
        "best_accuracy": round(best, 4),
        "trials": len(epochs),
        "pruned": states.count("PRUNED"),
        "completed": states.count("COMPLETED"),
        "failed": states.count("FAILED"),
        "epochs_past_prune_max": max(past) if past else None,
        "epoch_s": epoch_s,
        "concurrency": concurrency,
        "wall_s": round(wall_s, 1),
        "target": {"epochs_vs_unpruned": "<= 0.5"},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history", type=int, default=1000)
    parser.add_argument("--overhead-trials", type=int, default=200)
    parser.add_argument("--overhead-budget-s", type=float, default=240.0)
    parser.add_argument("--reporters", type=int, default=20)
    parser.add_argument(
        "--db", default=None, help="ingestion's database: postgresql://USER@HOST/DB"
    )
    parser.add_argument("--served-trials", type=int, default=14)
    parser.add_argument("--served-concurrency", type=int, default=3)
    parser.add_argument("--epoch-s", type=float, default=1.0)
    parts = ["efficiency", "overhead", "ingestion", "served"]
    parser.add_argument("--skip", nargs="*", default=[], choices=parts)
    parser.add_argument("--only", choices=parts, help="run only this part")
    args = parser.parse_args()
    if args.only:
        args.skip = [part for part in parts if part != args.only]
    root = Path(tempfile.mkdtemp(prefix="trainhub-hpo-"))
    try:
        if "efficiency" not in args.skip:
            data = Digits()
            lines = [efficiency_arm(arm, args.trials, args.seed, data, root) for arm in ARMS]
            baseline = lines[0]
            for line in lines:
                line["accuracy_gap_points"] = round(
                    100 * (baseline["best_accuracy"] - line["best_accuracy"]), 2
                )
                line["epochs_ratio"] = round(line["trial_epochs"] / baseline["trial_epochs"], 3)
                print(json.dumps(line), flush=True)
        if "overhead" not in args.skip:
            tpe = decision_latency(args.history, 100, root, "tpe")
            random_ = decision_latency(args.history, 100, root, "random")
            rate, done = trials_per_minute(args.overhead_trials, root, args.overhead_budget_s)
            with open("/proc/loadavg") as handle:
                load = float(handle.read().split()[0])
            print(
                json.dumps(
                    {
                        "benchmark": "hpo_overhead",
                        "trials_per_min": round(rate, 1),
                        "trials": done,
                        **tpe,
                        "sampler": "tpe",
                        "random": random_,
                        "load_average": load,
                        "finished_trials_in_study": args.history,
                        "targets": {"ask_p99_ms": "< 50", "prune_p99_ms": "< 50"},
                    }
                ),
                flush=True,
            )
        if "served" not in args.skip:
            line = served_arm(
                args.served_trials, args.served_concurrency, args.epoch_s, args.seed, root
            )
            print(json.dumps(line), flush=True)
        if "ingestion" not in args.skip:
            from ingestion import run as run_ingestion  # benchmarks/ingestion.py

            line = run_ingestion(args.reporters, args.db, root / "ingestion")
            print(json.dumps(line), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
