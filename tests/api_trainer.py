"""A Seq2SeqTrainer run of a few steps for tests/test_api.py, under torchrun (gloo, CPU), with
seq2seq_eval's EvalCallback at each evaluation and no predict_with_generate. The Trainer saves
a checkpoint right after each evaluation (save_steps = eval_steps), whose trainer_state.json
holds the logged metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
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


def examples(split: str, n: int) -> list[dict]:
    src = (Path(args.data) / f"{split}.source").read_text().splitlines()[:n]
    tgt = (Path(args.data) / f"{split}.target").read_text().splitlines()[:n]
    return [dict(tokenizer(s, text_target=t)) for s, t in zip(src, tgt)]


torch.manual_seed(0)
training_args = Seq2SeqTrainingArguments(
    output_dir=args.out, use_cpu=True, max_steps=2, per_device_train_batch_size=4, per_device_eval_batch_size=4,
    learning_rate=1e-4, eval_strategy="steps", eval_steps=2, save_steps=2, logging_steps=1, report_to=[],
    save_only_model=True, ddp_find_unused_parameters=True, dataloader_num_workers=0, disable_tqdm=True,
)
trainer = Seq2SeqTrainer(
    model=model, args=training_args, train_dataset=examples("train", 16), eval_dataset=examples("val", 4),
    data_collator=DataCollatorForSeq2Seq(tokenizer, model=model), processing_class=tokenizer,
)
trainer.add_callback(EvalCallback(trainer, data_dir=args.data, n_obs=args.n_obs, bs=4, sync_timeout=60))
trainer.train()
