"""A Hugging Face `Trainer` script, written for this project's tests.

A tiny token-level language model (a `PreTrainedModel` built from its config, nothing
downloaded) trained by `transformers.Trainer` on synthetic sequences of 2 to 12 tokens, padded
per batch with labels -100; its dropout draws from the global RNG. `TrainingArguments` sets the
batch, `gradient_accumulation_steps`, AdamW with a linear schedule and a checkpoint every
`save_steps` optimizer steps under `--out_dir` (the model as `model.safetensors`; optimizer,
scheduler and RNG states with `torch.save`); `--resume` continues with
`trainer.train(resume_from_checkpoint=...)` from the last one. `--batch` and `--grad-accum` cut
each step's batch into micro-batches (the same samples for the same product), `--double` trains
in float64, `--dropout 0` turns dropout off (micro-batches of another width draw other masks).

Faults: `data_skip_ignored` resumes with `ignore_data_skip=True` (set to resume faster): the
resumed run starts its epoch's batches from the first again (and, in the middle of an epoch, the
Trainer then leaves the saved RNG states unloaded). `loss_mean_per_batch` marks the
model `accepts_loss_kwargs = False`, so the Trainer does not pass `num_items_in_batch` and the
loss is each micro-batch's own token mean (divided by the accumulation steps): micro-batches
with fewer tokens weigh more than under one large batch.
"""

import argparse
import glob
import os

import torch
import transformers
from torch import nn
from torch.utils.data import Dataset
from transformers.modeling_outputs import CausalLMOutput

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--max_steps", type=int, default=9)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--grad-accum", type=int, default=1)
parser.add_argument("--double", action="store_true")
parser.add_argument("--dropout", type=float, default=0.1)
parser.add_argument("--fault", default="none", choices=["none", "data_skip_ignored", "loss_mean_per_batch"])
args = parser.parse_args()

VOCAB = 32


class Sequences(Dataset):
    """Sequences of 2 to 12 tokens; the labels are the next tokens."""

    def __init__(self, count=96):
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(3, 14, (count,), generator=generator)
        self.tokens = [torch.randint(0, VOCAB, (int(n),), generator=generator) for n in lengths]

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        tokens = self.tokens[index]
        return {"idx": index, "input_ids": tokens[:-1], "labels": tokens[1:]}


def collate(examples):
    width = max(len(e["input_ids"]) for e in examples)
    input_ids = torch.zeros(len(examples), width, dtype=torch.long)
    labels = torch.full((len(examples), width), -100)
    for row, example in enumerate(examples):
        input_ids[row, :len(example["input_ids"])] = example["input_ids"]
        labels[row, :len(example["labels"])] = example["labels"]
    return {"idx": torch.tensor([e["idx"] for e in examples]), "input_ids": input_ids, "labels": labels}


class TinyConfig(transformers.PretrainedConfig):
    model_type = "trainparity-tiny"

    def __init__(self, vocab_size=VOCAB, hidden_size=16, dropout=0.1, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.hidden_size, self.dropout = vocab_size, hidden_size, dropout


class TinyLM(transformers.PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, 32), nn.GELU(), nn.Dropout(config.dropout),
                                 nn.Linear(32, config.hidden_size))
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, labels=None, num_items_in_batch=None, **kwargs):
        hidden = self.embed(input_ids)
        logits = self.head(hidden + self.mlp(hidden))
        loss = None
        if labels is not None:
            losses = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
            # the Trainer counts the labelled tokens of all micro-batches of the step
            loss = losses / (num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum())
        return CausalLMOutput(loss=loss, logits=logits)


class Trainer(transformers.Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        probe.sample_ids(inputs.pop("idx"))
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


transformers.set_seed(0)
model = TinyLM(TinyConfig(dropout=args.dropout))
if args.double:
    model = model.double()
if args.fault == "loss_mean_per_batch":
    model.accepts_loss_kwargs = False
training_args = transformers.TrainingArguments(
    output_dir=args.out_dir, max_steps=args.max_steps, per_device_train_batch_size=args.batch,
    gradient_accumulation_steps=args.grad_accum, learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=2,
    save_strategy="steps", save_steps=3, seed=0, use_cpu=True, report_to="none", logging_strategy="no",
    disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
    ignore_data_skip=args.resume and args.fault == "data_skip_ignored",
)
trainer = Trainer(model=model, args=training_args, train_dataset=Sequences(), data_collator=collate)
checkpoints = sorted(glob.glob(os.path.join(args.out_dir, "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
trainer.train(resume_from_checkpoint=checkpoints[-1] if args.resume else None)
