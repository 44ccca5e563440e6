"""LeNet-5 on handwritten digits, data-parallel over two CPU workers: the trainhub example.

The data are scikit-learn's bundled digits (1,797 images of 8x8 pixels, no download), scaled up
to LeNet-5's 32x32 input. A few epochs reach over 95% validation accuracy in seconds.

Launch:

    python examples/mnist/train.py                                     # one process
    torchrun --standalone --nproc-per-node 2 examples/mnist/train.py   # two ranks (gloo)
    trainhub submit examples/mnist/experiment.yaml -C examples/mnist   # as a trainhub trial

Run standalone it writes ./trainhub-metrics.jsonl and ./checkpoints/step-N.pt, and resumes
from the latest checkpoint there: delete ./checkpoints to start over. Under trainhub the same
calls ship metrics and checkpoints to the control plane and resume a restarted trial.
"""

import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import trainhub
from trainhub.models import create as create_model
from trainhub.runtime import unwrap_model

# -----------------------------------------------------------------------------
# hyperparameters: defaults for standalone runs; a trial's values (experiment.yaml) win
lr = 0.005  # Adam's peak rate, annealed to 0 over the epochs (cosine)
batch_size = 32  # per rank: the global batch is batch_size * world size
epochs = 8
val_fraction = 0.2
seed = 0
sleep_per_epoch_s = 0.0  # > 0 stretches each epoch so tests can kill a rank mid-training
# -----------------------------------------------------------------------------


# the model zoo's LeNet-5 (LeCun et al. 1998, ReLU and max pooling) on 32x32 inputs; the spec
# declares the same (model.arch), so `trainhub models register` records an architecture that
# its weights load into, and `trainhub models export` rebuilds it
ARCH = {"zoo": "lenet5", "args": {"num_classes": 10, "image_size": 32}}


def build_model() -> nn.Module:
    return create_model(ARCH["zoo"], **ARCH["args"])


def load_data(val_fraction: float) -> tuple[TensorDataset, TensorDataset]:
    """Every rank builds the same split. It does not depend on the seed hyperparameter, so
    trials with different seeds are compared on the same validation images."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)
    images = (images - images.mean()) / images.std()
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    num_val = int(len(labels) * val_fraction)
    val, train = order[:num_val], order[num_val:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


@torch.no_grad()
def accuracy(model: nn.Module, dataset: TensorDataset, device: torch.device) -> float:
    # every rank scores the whole (small) validation set: all ranks hold the same weights, so
    # they agree without a collective
    model.eval()
    images, labels = dataset.tensors
    predictions = model(images.to(device)).argmax(dim=1)
    return float((predictions == labels.to(device)).float().mean())


def main() -> None:
    torch.set_num_threads(1)  # one core per rank; more threads only fight over the cores
    ctx = trainhub.init(
        hparams={
            "lr": lr,
            "batch_size": batch_size,
            "epochs": epochs,
            "val_fraction": val_fraction,
            "seed": seed,
            "sleep_per_epoch_s": sleep_per_epoch_s,
        }
    )
    hp = ctx.hparams
    torch.manual_seed(hp["seed"])  # DDP copies rank 0's initial weights anyway
    train_set, val_set = load_data(hp["val_fraction"])
    loader = ctx.prepare_data_loader(train_set, batch_size=hp["batch_size"], shuffle=True)
    model = ctx.prepare_model(build_model())  # DDP + the spec's `distributed` strategy
    optimizer = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=hp["lr"]))
    timer = ctx.step_timer()  # where each step's time goes, reported once per epoch

    start_epoch = 0
    state = ctx.restore()  # a restarted trial continues where its last checkpoint left off
    if state is not None:
        unwrap_model(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
        if ctx.is_chief:
            print(f"resuming after epoch {state['epoch']} (attempt {ctx.attempt})", flush=True)

    for epoch in range(start_epoch, hp["epochs"]):
        ctx.set_epoch(loader, epoch)  # a different shuffle each epoch, the same on all ranks
        # the rate follows from the epoch alone, so a resumed run needs no scheduler state
        for group in optimizer.param_groups:
            group["lr"] = hp["lr"] * 0.5 * (1 + math.cos(math.pi * epoch / hp["epochs"]))
        model.train()
        loss_sum = torch.zeros(2)  # sum of losses, number of samples
        for images, labels in timer.iter_data(loader):
            with timer.phase("forward"), ctx.autocast():
                loss = F.cross_entropy(model(images.to(ctx.device)), labels.to(ctx.device))
            with timer.phase("backward"):
                optimizer.zero_grad(set_to_none=True)
                ctx.backward(loss)  # DDP averages the gradients of all ranks here
            with timer.phase("optimizer"):
                ctx.step(optimizer)
            timer.end_step(num_samples=len(labels))
            ctx.profile_step()  # `trainhub profile TRIAL` profiles the steps that follow
            loss_sum += torch.tensor([loss.item() * len(labels), len(labels)])
        if ctx.world_size > 1:
            dist.all_reduce(loss_sum)  # the loss over all ranks' samples, not just rank 0's
        time.sleep(hp["sleep_per_epoch_s"])

        val_accuracy = accuracy(model, val_set, ctx.device)
        train_loss = (loss_sum[0] / loss_sum[1]).item()
        ctx.report(step=epoch, train_loss=train_loss, val_accuracy=val_accuracy, **timer.summary())
        ctx.set_progress(epoch + 1, total=hp["epochs"])
        if ctx.is_chief and ctx.managed:  # standalone, report() already prints the metrics
            print(f"epoch {epoch}: train_loss={train_loss:.4f} val_accuracy={val_accuracy:.4f}")
        ctx.save_checkpoint(
            {
                "model": unwrap_model(model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
            },
            step=epoch,
            metrics={"val_accuracy": val_accuracy},
        )
        if ctx.should_stop():  # pruned or preempted: the checkpoint above is where we resume
            if ctx.is_chief:
                print(f"stopping after epoch {epoch}: {ctx.stop_reason}", flush=True)
            break

    ctx.close()  # waits until metrics and checkpoint uploads are delivered


if __name__ == "__main__":
    main()
