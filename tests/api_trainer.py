"""A Seq2SeqTrainer run of a few steps for tests/test_api.py, under torchrun (gloo, CPU), with
seq2seq_eval's EvalCallback at each evaluation and no predict_with_generate. The Trainer saves
a checkpoint right after each evaluation (save_steps = eval_steps), whose trainer_state.json
holds the logged metrics.

The learning rate is high enough to make the translations worse at each step, so that
`load_best_model_at_end` picks an earlier checkpoint than the last. After training, rank 0
writes {out}/after.json: the best checkpoint, what `trainer.evaluate()` returns then (with the
default and another metric_key_prefix), and what it returns after the weights of another
checkpoint are loaded by hand."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                          Seq2SeqTrainingArguments)

from seq2seq_eval import EvalCallback

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--data", required=True)
p.add_argument("--out", required=True)
p.add_argument("--n_obs", type=int, default=9)
args = p.parse_args()

tokenizer = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForSeq2SeqLM.from_pretrained(args.model)
# transformers 5 leaves Marian's sinusoidal position tables trainable, and save_pretrained leaves
# them out (_keys_to_ignore_on_save): trained, they would make every checkpoint on disk another
# model than the one the Trainer held, and the command line on it give other scores.
for name, param in model.named_parameters():
    if "embed_positions" in name:
        param.requires_grad_(False)


def examples(split: str, n: int) -> list[dict]:
    src = (Path(args.data) / f"{split}.source").read_text().splitlines()[:n]
    tgt = (Path(args.data) / f"{split}.target").read_text().splitlines()[:n]
    return [dict(tokenizer(s, text_target=t)) for s, t in zip(src, tgt)]


torch.manual_seed(0)
training_args = Seq2SeqTrainingArguments(
    output_dir=args.out, use_cpu=True, max_steps=6, per_device_train_batch_size=4, per_device_eval_batch_size=4,
    learning_rate=3e-3, lr_scheduler_type="constant", eval_strategy="steps", eval_steps=2, save_steps=2,
    logging_steps=1, report_to=[], save_only_model=True, load_best_model_at_end=True, metric_for_best_model="bleu",
    ddp_find_unused_parameters=True, dataloader_num_workers=0, disable_tqdm=True,
)
trainer = Seq2SeqTrainer(
    model=model, args=training_args, train_dataset=examples("train", 48), eval_dataset=examples("val", args.n_obs),
    data_collator=DataCollatorForSeq2Seq(tokenizer, model=model), processing_class=tokenizer,
)
# "eval" is the Trainer's eval_dataset (val); "test" (evaluate(metric_key_prefix="test") below) is
# declared as the same files: tests/test_trainer_callback.py gives names other data.
val = {"data_dir": args.data, "type_path": "val"}
trainer.add_callback(EvalCallback(trainer, data={"eval": val, "test": val}, n_obs=args.n_obs, bs=4, sync_timeout=60))
trainer.train()

after = {"best": trainer.state.best_model_checkpoint, "evaluate": trainer.evaluate(),
         "evaluate_test": trainer.evaluate(metric_key_prefix="test")}
# Weights loaded by hand, of the checkpoint that is neither the best nor the last: the scores are
# those of its weights, whatever was evaluated last.
other = next(f"checkpoint-{k}" for k in (2, 4) if Path(after["best"]).name != f"checkpoint-{k}")
trainer.model.load_state_dict(load_file(str(Path(args.out) / other / "model.safetensors")), strict=False)
after["by_hand"] = {"checkpoint": other, "evaluate": trainer.evaluate()}
if trainer.is_world_process_zero():
    (Path(args.out) / "after.json").write_text(json.dumps(after, indent=1))
