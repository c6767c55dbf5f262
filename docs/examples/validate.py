"""One trainer rank that trains on one job and evaluates a second job, the validation split, every
``--every`` steps. Start one per GPU with torchrun, which sets RANK and WORLD_SIZE:

    mdata cluster up --plan train.yaml        # serves the training sources, job `default`
    torchrun --nproc-per-node 2 docs/examples/validate.py --scheduler tcp://127.0.0.1:8786 \\
        --val-plan val.yaml --steps 6 --every 3 --val-batches 2

The validation job is a plan of its own over held-out files (docs/recipes.md, "A validation
split"): the first rank to arrive registers it from ``--val-plan`` (and the training job from
``--plan``, when ``cluster up`` did not). Each rank holds two Loaders, one per job; the validation
Loader is read ``--val-batches`` batches at a time, so its job goes on where the last evaluation
stopped and, over evaluations, walks the whole held-out set epoch after epoch (with
``--val-batches`` times the validation plan's global batch equal to the held-out rows, each
evaluation is one whole epoch).

The model is a toy (token ids folded into a small vocabulary, one attention layer) so that the
example runs on CPUs in seconds; what it shows is the loop: packed documents attended separately
through ``cu_seqlens``, labels already shifted, ``-100`` ignored, the loss weighted by tokens
over all DP ranks. Its attention sees whole sequences, so the plans' mesh is DP only (context
parallelism needs attention across the CP group: docs/recipes.md).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mdata.errors import MdataError
from mdata.plan import Plan
from mdata.trainer import Loader

IGNORE_INDEX = -100  # mdata's labels use it where there is nothing to predict (docs/batch.md)
VOCAB = 4096  # the toy's vocabulary: real token ids are folded into it


class TinyLM(torch.nn.Module):
    """Embeddings, one causal attention layer over each packed document, an output projection."""

    def __init__(self, dim: int = 64, max_positions: int = 8192) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, dim)
        self.positions = torch.nn.Embedding(max_positions, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, VOCAB)

    def forward(self, input_ids, position_ids, cu_seqlens):
        x = self.tokens(input_ids % VOCAB) + self.positions(position_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # What flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
        # causal=True) computes, in plain torch: each token sees the earlier tokens of its document.
        doc = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1, device=x.device),
                                      cu_seqlens.diff().long())
        causal = torch.ones(len(x), len(x), dtype=torch.bool, device=x.device).tril()
        mask = causal & (doc[:, None] == doc[None, :])
        attended = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)[0]
        return self.out(x + attended)


def fold(labels: torch.Tensor) -> torch.Tensor:
    """Targets in the toy's vocabulary, as int64 (what cross_entropy takes), -100 kept."""
    labels = labels.long()
    return torch.where(labels == IGNORE_INDEX, labels, labels % VOCAB)


def loss_sum(model, mb) -> tuple[torch.Tensor, int]:
    """The summed loss of one micro-batch and the number of tokens it has targets for."""
    logits = model(mb["input_ids"], mb["position_ids"], mb["cu_seqlens"])
    targets = fold(mb["labels"])
    total = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return total, int((targets != IGNORE_INDEX).sum())


def train_step(model, optimizer, batch) -> float:
    """Accumulate every micro-batch, weight by the step's tokens over all DP ranks, sum the grads."""
    micro_batches = [mb for mb in batch["micro_batches"] if len(mb["input_ids"])]  # skip empty ones
    tokens = torch.tensor(float(sum(int((mb["labels"] != IGNORE_INDEX).sum()) for mb in micro_batches)))
    dist.all_reduce(tokens)  # the step's tokens over all ranks: every token weighs the same
    optimizer.zero_grad()
    step_loss = torch.zeros(())
    for mb in micro_batches:
        total, _ = loss_sum(model, mb)
        (total / tokens).backward()
        step_loss += total.detach()
    for param in model.parameters():  # what DDP does, spelled out: the sum of every rank's part
        dist.all_reduce(param.grad)
    optimizer.step()
    dist.all_reduce(step_loss)
    return float(step_loss / tokens)


@torch.no_grad()
def evaluate(model, val_batches, count: int) -> tuple[float, int]:
    """Mean loss per target token over ``count`` validation steps of every rank."""
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64)
    for batch in itertools.islice(val_batches, count):
        for mb in batch["micro_batches"]:
            if len(mb["input_ids"]):
                total, tokens = loss_sum(model, mb)
                sums += torch.tensor([float(total), float(tokens)], dtype=torch.float64)
    model.train()
    dist.all_reduce(sums)
    return float(sums[0] / sums[1]), int(sums[1])


def main() -> None:
    parser = argparse.ArgumentParser(description="an mdata trainer rank with a validation job")
    parser.add_argument("--scheduler", required=True, help="the mdata scheduler's address")
    parser.add_argument("--job", default="default", help="the training job (default: default)")
    parser.add_argument("--plan", default=None, help="a plan file to register the training job from")
    parser.add_argument("--val-job", default="validation", help="the validation job's name")
    parser.add_argument("--val-plan", default=None, help="a plan file to register it from")
    parser.add_argument("--steps", type=int, default=6, help="training steps")
    parser.add_argument("--every", type=int, default=3, help="evaluate after every N steps")
    parser.add_argument("--val-batches", type=int, default=2, help="validation steps per evaluation")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # the toy trains on CPUs; use nccl for a model on GPUs
    rank = dist.get_rank()
    try:
        run(args, rank)
    except MdataError as exc:  # one line per rank: what went wrong and what to do
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    dist.destroy_process_group()


def run(args: argparse.Namespace, rank: int) -> None:
    plan = None if args.plan is None else Plan.from_file(args.plan)
    val_plan = None if args.val_plan is None else Plan.from_file(args.val_plan)
    torch.manual_seed(0)  # every rank starts from the same weights
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with contextlib.ExitStack() as stack:
        # device=None: CPU tensors for the toy (a GPU model leaves it out: batches land on its GPU)
        train = stack.enter_context(Loader(args.scheduler, job=args.job, plan=plan,
                                           steps=args.steps, device=None))
        val = stack.enter_context(Loader(args.scheduler, job=args.val_job, plan=val_plan,
                                         device=None))
        val.attach()  # register and lease now: its chunks load while the first steps train
        val_batches = iter(val)
        for batch in train:
            loss = train_step(model, optimizer, batch)
            print(f"rank {rank} step {batch['step']}: train loss {loss:.3f}", flush=True)
            if (batch["step"] + 1) % args.every == 0:
                val_loss, tokens = evaluate(model, val_batches, args.val_batches)
                val.mark_consumed()  # the last validation batch is done: tell its job now
                print(f"rank {rank} step {batch['step']}: validation loss {val_loss:.3f} over "
                      f"{tokens} tokens", flush=True)
        # save both with the model; resume each with Loader(..., checkpoint=...)
        state = {"train": train.state_dict(), "validation": val.state_dict()}
    print(f"rank {rank} resumes at step {state['train']['next_step']}, validation at step "
          f"{state['validation']['next_step']}", flush=True)


if __name__ == "__main__":
    main()
