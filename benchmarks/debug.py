"""Finding mislabeled samples from one training run's dynamics, against cleanlab with 5-fold CV.

MNIST t10k (../shared/data/mnist) split 8,000 train / 2,000 validation (trainhub.data, seed 0),
LeNet-5 (trainhub.models), SGD, a fixed seed, one CPU thread. Two arms: 10% symmetric label noise
(a random other class) and 10% class-conditional noise (each class flips to one confusable
class: 7->1, 1->7, 3->8, 8->3, 5->6, 6->5, 4->9, 9->4, 2->7, 0->6).

Per arm:
- trainhub: one training on the noisy labels with ``SampleTracker`` (what ``ctx.track_samples``
  runs), scored by trainhub.core.label_noise (flagged: AUM < 0);
- cleanlab: ``find_label_issues`` on 5-fold cross-validated predicted probabilities of the same
  model, trained the same epochs on each 4/5;
- precision, recall, F1 of the flagged set against the injected flips;
- compute_vs_cleanlab: CPU seconds of our one tracked training / CPU seconds of cleanlab's 5
  fold trainings (the final training on all data is not counted for cleanlab: it is the
  user's training, which our tracked run already is);
- recovered_fraction: retrain without the flagged samples; (acc_cleaned - acc_noisy) /
  (acc_clean_labels - acc_noisy) on the 2,000 clean validation samples.
tracking_overhead: seconds spent in the tracker (its calls and the copies to the host) / the
rest of the training steps' seconds, in the tracked runs of this same process.

    HOME=$(mktemp -d) nice -n 10 .venv/bin/python benchmarks/debug.py [--epochs 12]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from trainhub import data
from trainhub.core.label_noise import score_samples
from trainhub.core.sample_dynamics import SampleRecords, concat, records_from_columns
from trainhub.data.loader import make_loader
from trainhub.models.lenet import LeNet5
from trainhub.runtime import protocol
from trainhub.runtime.sample_tracking import SampleTracker

CONFUSABLE = {7: 1, 1: 7, 3: 8, 8: 3, 5: 6, 6: 5, 4: 9, 9: 4, 2: 7, 0: 6}


class MemorySink:
    def __init__(self) -> None:
        self.batches: list[protocol.SampleRecordsBatch] = []

    def send(self, batch: protocol.SampleRecordsBatch) -> None:
        self.batches.append(batch)

    def close(self, timeout_s: float) -> bool:
        return True

    def records(self) -> SampleRecords:
        return concat([records_from_columns(b, 10) for b in self.batches])  # type: ignore[arg-type]


def inject(labels: np.ndarray, kind: str, rate: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noisy = labels.copy()
    flip = rng.choice(len(labels), size=round(rate * len(labels)), replace=False)
    if kind == "symmetric":
        noisy[flip] = (labels[flip] + rng.integers(1, 10, size=len(flip))) % 10
    else:
        noisy[flip] = [CONFUSABLE[int(c)] for c in labels[flip]]
    return noisy


class Trainer:
    def __init__(self, epochs: int, batch_size: int, lr: float, seed: int) -> None:
        self.epochs, self.batch_size, self.lr, self.seed = epochs, batch_size, lr, seed
        self.tracking_s = 0.0
        self.step_s = 0.0

    def train(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        ids: torch.Tensor,
        tracker: SampleTracker | None = None,
    ) -> tuple[nn.Module, float]:
        """The model and the CPU seconds its training took."""
        torch.manual_seed(self.seed)
        model = LeNet5()
        opt = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=0.9, weight_decay=5e-4)
        loader = make_loader(
            torch.utils.data.TensorDataset(x, y, ids), self.batch_size, seed=self.seed
        )
        started = time.process_time()
        for epoch in range(self.epochs):
            loader.set_epoch(epoch)  # type: ignore[union-attr]
            model.train()
            for xb, yb, ib in loader:
                t0 = time.perf_counter()
                logits = model(xb)
                loss = nn.functional.cross_entropy(logits, yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                t1 = time.perf_counter()
                if tracker is not None:
                    tracker.track(ib, logits, yb, epoch=epoch)
                    t2 = time.perf_counter()
                    self.tracking_s += t2 - t1
                    self.step_s += t1 - t0
        if tracker is not None:
            t0 = time.perf_counter()
            tracker.flush()
            self.tracking_s += time.perf_counter() - t0
        return model, time.process_time() - started


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def predict_probs(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return torch.softmax(model(x), 1).numpy()


def prf(flagged: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    tp = int((flagged & truth).sum())
    precision = tp / max(1, int(flagged.sum()))
    recall = tp / max(1, int(truth.sum()))
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def cleanlab_flags(
    trainer: Trainer, x: torch.Tensor, noisy: np.ndarray, seed: int
) -> tuple[np.ndarray, float]:
    from cleanlab.filter import find_label_issues
    from sklearn.model_selection import StratifiedKFold

    probs = np.zeros((len(noisy), 10), dtype=np.float64)
    seconds = 0.0
    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=seed)
    y = torch.from_numpy(noisy)
    for train, held in folds.split(np.zeros(len(noisy)), noisy):
        model, cpu_s = trainer.train(x[train], y[train], torch.from_numpy(train))
        seconds += cpu_s
        probs[held] = predict_probs(model, x[held])
    return np.asarray(find_label_issues(noisy, probs)), seconds


def run_arm(
    kind: str,
    trainer: Trainer,
    splits: data.Splits,
    clean_accuracy: float,
    seed: int,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    x, clean, ids = (
        splits.train.tensors[0],  # type: ignore[attr-defined]
        splits.train.tensors[1].numpy(),  # type: ignore[attr-defined]
        splits.train.sample_ids,  # type: ignore[attr-defined]
    )
    xv, yv = splits.val.tensors  # type: ignore[attr-defined]
    noisy = inject(clean, kind, 0.10, seed)
    truth_by_position = noisy != clean
    sink = MemorySink()
    tracker = SampleTracker(torch.device("cpu"), sink)
    model, ours_s = trainer.train(x, torch.from_numpy(noisy), ids, tracker)
    noisy_accuracy = accuracy(model, xv, yv)
    scores = score_samples(sink.records())
    # scores are sorted by id; map back to positions in the training set
    position = {int(i): p for p, i in enumerate(ids.tolist())}
    truth = np.array([truth_by_position[position[int(i)]] for i in scores.ids])
    precision, recall, f1 = prf(scores.flagged, truth)
    candidates = {}
    for method in ("aum", "confidence", "forgetting", "combined"):
        other = score_samples(sink.records(), method=method)
        candidates[method] = round(prf(other.flagged, truth)[2], 4)

    cl_flags, cleanlab_s = cleanlab_flags(trainer, x, noisy, seed)
    _, _, cl_f1 = prf(cl_flags, truth_by_position)

    keep = np.ones(len(noisy), dtype=bool)
    flagged_ids = set(scores.ids[scores.flagged].tolist())
    keep[[position[i] for i in flagged_ids]] = False
    fixed, _ = trainer.train(x[keep], torch.from_numpy(noisy[keep]), ids[keep])
    fixed_accuracy = accuracy(fixed, xv, yv)
    cost = clean_accuracy - noisy_accuracy
    recovered = (fixed_accuracy - noisy_accuracy) / cost if cost > 0 else float("nan")
    emit(
        {
            "benchmark": "label_noise",
            "noise": kind,
            "precision": round(precision, 4),
            "recall": round(recall, 4),
            "f1": round(f1, 4),
            "cleanlab_f1": round(cl_f1, 4),
            "compute_vs_cleanlab": round(ours_s / cleanlab_s, 4),
            "recovered_fraction": round(recovered, 4),
            "flagged": int(scores.flagged.sum()),
            "cleanlab_flagged": int(cl_flags.sum()),
            "injected": int(truth.sum()),
            "f1_by_score": candidates,
            "val_accuracy": {
                "clean_labels": round(clean_accuracy, 4),
                "noisy": round(noisy_accuracy, 4),
                "cleaned": round(fixed_accuracy, 4),
            },
            "cpu_s": {"trainhub": round(ours_s, 1), "cleanlab_5_folds": round(cleanlab_s, 1)},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", default="symmetric,class_conditional")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the benchmark machine is shared; CPU seconds stay comparable
    splits = data.load("mnist")

    def emit(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)

    trainer = Trainer(args.epochs, args.batch_size, args.lr, args.seed)
    x, y = splits.train.tensors  # type: ignore[attr-defined]
    clean_model, _ = trainer.train(x, y, splits.train.sample_ids)  # type: ignore[attr-defined]
    clean_accuracy = accuracy(clean_model, *splits.val.tensors)  # type: ignore[attr-defined]
    for kind in args.arms.split(","):
        run_arm(kind, trainer, splits, clean_accuracy, args.seed, emit)
    emit(
        {
            "benchmark": "tracking_overhead",
            "overhead": round(trainer.tracking_s / trainer.step_s, 4),
            "tracking_s": round(trainer.tracking_s, 2),
            "step_s": round(trainer.step_s, 1),
        }
    )


if __name__ == "__main__":
    main()
