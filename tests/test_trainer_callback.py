"""EvalCallback inside a real Seq2SeqTrainer (in-process, CPU, the embedded model): every score
it reports is the score of the data that evaluation is of, on the weights of the checkpoint saved
at that step, and is in the metrics before any other callback reads them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, EarlyStoppingCallback,
                          Seq2SeqTrainer, Seq2SeqTrainingArguments)

import seq2seq_eval
from seq2seq_eval import EvalCallback
from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL
from seq2seq_eval.errors import ConfigError

DATA = EMBEDDED_DATA["translation"]
N = 6
MAX_STEPS = 8
OPTIONS = dict(n_obs=N, bs=8, num_beams=2, max_new_tokens=16)


def lines(split: str) -> tuple[list[str], list[str]]:
    return ((DATA / f"{split}.source").read_text().splitlines()[:N],
            (DATA / f"{split}.target").read_text().splitlines()[:N])


def rows(tokenizer, split: str, text: bool, n: int = N) -> list[dict]:
    src = (DATA / f"{split}.source").read_text().splitlines()[:n]
    tgt = (DATA / f"{split}.target").read_text().splitlines()[:n]
    return [dict(tokenizer(s, text_target=t), **({"source": s, "target": t, "id": f"{split}{i}"} if text else {}))
            for i, (s, t) in enumerate(zip(src, tgt))]


def model_and_tokenizer(freeze: bool = True):
    tokenizer = AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(EMBEDDED_MODEL), dropout=0.2)
    if freeze:  # trainable, but never in a checkpoint: refused otherwise (test below)
        for name, param in model.named_parameters():
            if "embed_positions" in name:
                param.requires_grad_(False)
    return model, tokenizer


def trainer_of(model, tokenizer, out: Path, eval_dataset, **kwargs) -> Seq2SeqTrainer:
    args = Seq2SeqTrainingArguments(
        output_dir=str(out), use_cpu=True, max_steps=MAX_STEPS, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, learning_rate=3e-3, lr_scheduler_type="constant", eval_strategy="steps",
        eval_steps=2, save_steps=2, logging_steps=2, report_to=[], save_only_model=True, load_best_model_at_end=True,
        metric_for_best_model="eval_a_bleu", seed=7, dataloader_num_workers=0, disable_tqdm=True)
    return Seq2SeqTrainer(model=model, args=args, train_dataset=rows(tokenizer, "train", False, 32),
                          eval_dataset=eval_dataset, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                          processing_class=tokenizer, **kwargs)


def test_every_score_is_its_own_data_on_its_checkpoint(tmp_path, caplog):
    """A dict of eval datasets ("a" carries its texts, "b" is declared as files), early stopping
    given in the constructor, then evaluate(metric_key_prefix="test") and predict() after the best
    checkpoint is loaded: each score equals evaluate() on the saved checkpoint's path (the command
    line's run) with that name's data."""
    model, tokenizer = model_and_tokenizer()
    out = tmp_path / "out"
    trainer = trainer_of(model, tokenizer, out, {"a": rows(tokenizer, "val", True), "b": rows(tokenizer, "test", False)},
                         callbacks=[EarlyStoppingCallback(early_stopping_patience=1)])
    trainer.add_callback(EvalCallback(trainer, data={"eval_b": {"data_dir": str(DATA), "type_path": "test"}}, **OPTIONS))
    trainer.train()
    logged: dict[int, dict] = {}
    for record in trainer.state.log_history:  # one record per dataset: the Trainer's loss with the score
        if any(k.endswith("_loss") and k.startswith("eval_") for k in record):
            name = next(k for k in record if k.endswith("_loss"))[: -len("_loss")]
            assert f"{name}_bleu" in record, record
            logged.setdefault(record["step"], {}).update(record)
    steps = sorted(logged)
    # Early stopping (given before the tool's callback) read eval_a_bleu: training stopped at the
    # first evaluation that did not beat the best, not at max_steps.
    assert trainer.state.global_step == steps[-1] < MAX_STEPS
    assert logged[steps[-1]]["eval_a_bleu"] <= max(logged[s]["eval_a_bleu"] for s in steps[:-1])
    best = Path(trainer.state.best_model_checkpoint)

    after_test = trainer.evaluate(eval_dataset=rows(tokenizer, "test", True), metric_key_prefix="test")
    predicted = trainer.predict(rows(tokenizer, "val", True)).metrics
    after = trainer.evaluate()

    def reference(checkpoint: Path, split: str) -> float:
        save = tmp_path / "ref" / f"{checkpoint.name}_{split}"
        return seq2seq_eval.evaluate(str(checkpoint), data_dir=str(DATA), type_path=split, save_dir=str(save),
                                     **OPTIONS).metrics["bleu"]

    for step in steps:
        checkpoint = out / f"checkpoint-{step}"
        assert logged[step]["eval_a_bleu"] == reference(checkpoint, "val")
        assert logged[step]["eval_b_bleu"] == reference(checkpoint, "test")
        assert logged[step]["eval_a_bleu"] != logged[step]["eval_b_bleu"]  # the two data tell apart
    at_best = logged[int(best.name.split("-")[1])]
    # The same data as "b" and "a": the Trainer's loss and the tool's score agree on what it is.
    assert (after_test["test_bleu"], after_test["test_loss"]) == (at_best["eval_b_bleu"], after["eval_b_loss"])
    assert (predicted["test_bleu"], predicted["test_loss"]) == (at_best["eval_a_bleu"], after["eval_a_loss"])
    assert (after["eval_a_bleu"], after["eval_b_bleu"]) == (at_best["eval_a_bleu"], at_best["eval_b_bleu"])
    assert not any(k.startswith("eval") for k in after_test) and not any(k.startswith("eval") for k in predicted)

    # A name with no data: no score, one warning, however often it is evaluated.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        plain = [trainer.evaluate(eval_dataset=rows(tokenizer, "test", False), metric_key_prefix="other")
                 for _ in range(2)]
    assert all("other_loss" in m and not any(k.endswith("_bleu") for k in m) for m in plain)
    assert caplog.text.count("no data for the evaluation named 'other'") == 1


def test_refused_in_one_line_before_training(tmp_path):
    """Marian's position tables, trainable but left out of every checkpoint (trained, a step's
    score would be of other weights than its checkpoint's: seen as 2 of 40 generations apart),
    when the callback is made and when one is unfrozen later; arguments that could give a name
    another name's data; a second callback on one Trainer."""
    model, tokenizer = model_and_tokenizer(freeze=False)
    trainer = trainer_of(model, tokenizer, tmp_path, rows(tokenizer, "val", True, 2))
    with pytest.raises(ConfigError, match=r"model\.encoder\.embed_positions\.weight, "
                                          r"model\.decoder\.embed_positions\.weight: trainable, but no checkpoint"):
        EvalCallback(trainer, **OPTIONS)
    for name, param in model.named_parameters():
        if "embed_positions" in name:
            param.requires_grad_(False)
    for kwargs, message in [
        (dict(metric_key_prefix="test"), "metric_key_prefix: the Trainer's, for each evaluation"),
        (dict(data=[("eval", {})]), "data must be a dict of evaluation name -> data options, got list"),
        (dict(data={"eval": {"data_dir": "x"}}, data_dir="y"), r"data\['eval'\]: the data options given directly"),
        (dict(data={"test": {"data_dir": "x", "num_beams": 2}}), r"data\['test'\]: num_beams is not a data option"),
        (dict(data={"test": {}}), r"data\['test'\]: expected evaluate's data options"),
        (dict(data={"": {"data_dir": "x"}}), "'' is not an evaluation name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            EvalCallback(trainer, **kwargs)
    callback = EvalCallback(trainer, **OPTIONS)
    with pytest.raises(ConfigError, match="this Trainer has one already"):
        EvalCallback(trainer)
    model.get_parameter("model.decoder.embed_positions.weight").requires_grad_(True)  # unfrozen afterwards
    with pytest.raises(ConfigError, match=r"model\.decoder\.embed_positions\.weight: trainable"):
        trainer.evaluate()
    assert callback.last is None


def test_datasets_carry_their_examples_or_not():
    from seq2seq_eval.callback import examples_of

    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"source": ["a b", "c"], "target": ["x", "y"], "input_ids": [[1], [2]]})
    assert examples_of(table) == {"sources": ["a b", "c"], "references": ["x", "y"]}
    assert examples_of(table.remove_columns("target")) is None
    assert examples_of([{"source": "a", "target": "x", "id": 3}, {"source": "b", "target": "y"}]) == \
        {"sources": ["a", "b"], "references": ["x", "y"]}  # an id only some rows have is no id column
    assert examples_of([{"source": "a", "target": "x", "id": 3}]) == {"sources": ["a"], "references": ["x"], "ids": [3]}
    assert examples_of(torch.utils.data.TensorDataset(torch.zeros(2))) is None
    assert examples_of([]) is None and examples_of(None) is None
