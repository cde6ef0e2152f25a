"""A training script shaped like nanoGPT's train.py, written for this project's tests.

It runs at import, parses its arguments, draws its batches from the global torch RNG
(`get_batch`), prefetches the next batch, evaluates on random batches every `eval_interval`
iterations and saves a checkpoint dict there, and resumes with `--init_from resume`.
`--fault` makes its resume lose something: `rng_not_saved` (the checkpoint holds no RNG state,
as in nanoGPT itself), `prefetch_lost` (the RNG is saved after the next batch was drawn, and
the resumed run draws a new one: it skips a batch) or `eval_again` (the resumed run evaluates
again at the iteration it resumes at, as nanoGPT's loop does, which draws its random batches
a second time). `--batch` and `--grad_accum` cut each step's batch into micro-batches (the same
samples for the same product); `--fault loss_not_scaled` forgets to divide the loss by
`--grad_accum`. `--double` trains in float64. `--checkpoint sharded` saves as large-model trainers
do, in several files: the model and optimizer with `torch.distributed.checkpoint` (DCP), then the
iteration, RNG state and prefetched batch with `torch.save`.
"""

import argparse
import math
import os

import torch
import torch.utils.checkpoint
from torch import nn

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
parser.add_argument("--max_iters", type=int, default=10)
parser.add_argument("--eval_interval", type=int, default=3)
FAULTS = ["none", "rng_not_saved", "prefetch_lost", "eval_again", "loss_not_scaled"]
parser.add_argument("--fault", default="none", choices=FAULTS)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--grad_accum", type=int, default=1)
parser.add_argument("--double", action="store_true")
parser.add_argument("--checkpoint", default="dict", choices=["dict", "sharded"])
parser.add_argument("--compile", default="none", choices=["none", "aot_eager"], help="torch.compile's backend")
parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing of the MLP")
args = parser.parse_args()

torch.manual_seed(1337)
VOCAB, BLOCK, BATCH = 32, 8, args.batch * args.grad_accum
data = torch.randint(0, VOCAB, (512,), generator=torch.Generator().manual_seed(0))


def get_batch():
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])
    return x, y, ix


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.lm_head = nn.Linear(16, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT
        self.gradient_checkpointing = args.checkpointing  # the flag transformers' models carry

    def forward(self, x, y=None):
        h = self.wte(x)
        if self.gradient_checkpointing and self.training:
            mixed = torch.utils.checkpoint.checkpoint(self.mlp, h, use_reentrant=False)
        else:
            mixed = self.mlp(h)
        logits = self.lm_head(h + mixed)
        loss = None if y is None else nn.functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        return logits, loss


def get_lr(it, warmup=2, base=1e-2):
    return base * (it + 1) / warmup if it < warmup else base * 0.5 * (1 + math.cos(math.pi * it / 100))


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = [model(*get_batch()[:2])[1].item() for _ in range(2)]
    model.train()
    return sum(losses) / len(losses)


model = TinyLM().double() if args.double else TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
if args.compile != "none":  # as nanoGPT does: compiled after the optimizer is made
    model = torch.compile(model, backend=args.compile)
iter_num = 0
batch = None
resumed_at = None
checkpoint_path = os.path.join(args.out_dir, "ckpt.pt")
sharded_path = os.path.join(args.out_dir, "ckpt_dcp")


def save_checkpoint(checkpoint):
    if args.checkpoint == "dict":
        torch.save(checkpoint, checkpoint_path)
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=sharded_path)
    torch.save({k: v for k, v in checkpoint.items() if k not in ("model", "optimizer")}, checkpoint_path)


def load_checkpoint():
    if args.checkpoint == "dict":
        checkpoint = torch.load(checkpoint_path, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        return checkpoint
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    sharded = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(sharded, checkpoint_id=sharded_path)
    set_state_dict(model, optimizer, model_state_dict=sharded["model"], optim_state_dict=sharded["optimizer"])
    return torch.load(checkpoint_path, weights_only=False)


if args.init_from == "resume":
    checkpoint = load_checkpoint()
    iter_num = checkpoint["iter_num"]
    if "rng" in checkpoint:
        torch.set_rng_state(checkpoint["rng"])
    batch = checkpoint.get("batch")
    resumed_at = iter_num

X, Y, ix = batch if batch is not None else get_batch()  # the first batch (or the one saved with the checkpoint)
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    evaluated_before_the_save = iter_num == resumed_at and args.fault != "eval_again"
    if iter_num % args.eval_interval == 0 and iter_num > 0 and not evaluated_before_the_save:
        estimate_loss()
        checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
        if args.fault != "rng_not_saved":
            checkpoint["rng"] = torch.get_rng_state()
        if args.fault in ("none", "eval_again"):
            checkpoint["batch"] = (X, Y, ix)
        save_checkpoint(checkpoint)
    if iter_num >= args.max_iters:
        break
    probe.sample_ids(ix)
    for micro in range(args.grad_accum):
        part = slice(micro * args.batch, (micro + 1) * args.batch)
        _, loss = model(X[part], Y[part])
        if args.fault != "loss_not_scaled":
            loss = loss / args.grad_accum
        if micro == args.grad_accum - 1:
            X_next, Y_next, ix_next = get_batch()  # prefetch the next batch while this one trains
        loss.backward()
    X, Y, ix = X_next, Y_next, ix_next
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
