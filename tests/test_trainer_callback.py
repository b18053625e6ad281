"""EvalCallback inside a real Seq2SeqTrainer (in-process, CPU, the embedded model): every score
it reports is the score of the data that evaluation is of, on the weights of the checkpoint saved
at that step, and is in the metrics before any other callback reads them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, DataCollatorWithPadding,
                          EarlyStoppingCallback, Seq2SeqTrainer, Seq2SeqTrainingArguments)

import seq2seq_eval
from seq2seq_eval import EvalCallback
from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL
from seq2seq_eval.errors import ConfigError

DATA = EMBEDDED_DATA["translation"]
N = 6
MAX_STEPS = 8
OPTIONS = dict(n_obs=N, bs=8, num_beams=2, max_new_tokens=16)


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


def trainer_of(model, tokenizer, out: Path, eval_dataset, training: dict | None = None, **kwargs) -> Seq2SeqTrainer:
    args = Seq2SeqTrainingArguments(
        **(training or {}), output_dir=str(out), use_cpu=True, max_steps=MAX_STEPS, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, learning_rate=3e-3, lr_scheduler_type="constant", eval_strategy="steps",
        eval_steps=2, save_steps=2, logging_steps=2, report_to=[], save_only_model=True, load_best_model_at_end=True,
        metric_for_best_model="eval_a_bleu", seed=7, dataloader_num_workers=0, disable_tqdm=True)
    return Seq2SeqTrainer(model=model, args=args, train_dataset=rows(tokenizer, "train", False, 32),
                          eval_dataset=eval_dataset, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                          processing_class=tokenizer, **kwargs)


def test_every_score_is_its_own_data_on_its_checkpoint(tmp_path, caplog):
    """A dict of eval datasets ("a" declared as files, "b" carrying its texts) with
    EarlyStoppingCallback given in the constructor, then evaluate(metric_key_prefix="test") on val
    and predict() on test: each score equals evaluate() on the path of the checkpoint saved at
    that step (the command line's run) with that name's data."""
    model, tokenizer = model_and_tokenizer()
    out = tmp_path / "out"
    val, test = rows(tokenizer, "val", True), rows(tokenizer, "test", True)
    # Patience 0 stops at the first evaluation whose eval_a_bleu early stopping finds; without it,
    # training runs to max_steps.
    trainer = trainer_of(model, tokenizer, out, {"a": rows(tokenizer, "val", False), "b": test},
                         callbacks=[EarlyStoppingCallback(early_stopping_patience=0)])
    trainer.add_callback(EvalCallback(trainer, data={"eval_a": {"data_dir": str(DATA), "type_path": "val"}}, **OPTIONS))
    trainer.train()
    logged: dict[str, float] = {}
    for record in trainer.state.log_history:  # one record per dataset: the Trainer's loss with the score
        if any(k.endswith("_loss") and k.startswith("eval_") for k in record):
            logged.update(record)
    assert trainer.state.global_step == 2 < MAX_STEPS and logged["step"] == 2
    assert Path(trainer.state.best_model_checkpoint).name == "checkpoint-2"

    on_val = trainer.evaluate(eval_dataset=val, metric_key_prefix="test")
    predicted = trainer.predict(test).metrics
    # Rows without labels: the loop returns no loss (no key tells its name) and predict() adds its
    # speed metrics under the name before on_predict, where the score is added.
    collator, trainer.data_collator = trainer.data_collator, DataCollatorWithPadding(tokenizer)  # no labels: None
    trainer.args.predict_with_generate = True  # the model needs decoder inputs to run without labels
    unlabeled = trainer.predict([{k: v for k, v in r.items() if k != "labels"} for r in test]).metrics
    trainer.args.predict_with_generate, trainer.data_collator = False, collator
    after = trainer.evaluate()

    def reference(split: str) -> float:  # the command line's run on the checkpoint
        return seq2seq_eval.evaluate(str(out / "checkpoint-2"), data_dir=str(DATA), type_path=split,
                                     save_dir=str(tmp_path / "ref" / split), **OPTIONS).metrics["bleu"]

    bleu = {"val": reference("val"), "test": reference("test")}
    assert bleu["val"] != bleu["test"]  # the two data tell apart
    assert (logged["eval_a_bleu"], logged["eval_b_bleu"]) == (bleu["val"], bleu["test"])
    assert (after["eval_a_bleu"], after["eval_b_bleu"]) == (bleu["val"], bleu["test"])
    # The Trainer's loss and the tool's score are of the same data.
    assert (on_val["test_bleu"], on_val["test_loss"]) == (bleu["val"], after["eval_a_loss"])
    assert (predicted["test_bleu"], predicted["test_loss"]) == (bleu["test"], after["eval_b_loss"])
    assert unlabeled["test_bleu"] == bleu["test"] and not any(k.endswith("_loss") for k in unlabeled)
    assert not any(k.startswith("eval") for k in on_val) and not any(k.startswith("eval") for k in predicted)

    # Another dataset evaluated as "eval_a" is not the one its declared files are of: it is scored
    # on its own examples when it carries them, else not at all.
    swapped = trainer.evaluate(eval_dataset={"a": test})
    assert (swapped["eval_a_bleu"], swapped["eval_a_loss"]) == (bleu["test"], after["eval_b_loss"])
    # A name with no data: no score, one warning, however often it is evaluated.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        plain = [trainer.evaluate(eval_dataset=rows(tokenizer, "test", False), metric_key_prefix="other")
                 for _ in range(2)] + [trainer.evaluate(eval_dataset={"a": rows(tokenizer, "val", False)})]
    assert all(any(k.endswith("_loss") for k in m) and not any(k.endswith("_bleu") for k in m) for m in plain)
    assert caplog.text.count("no other_bleu...: no data is declared for it") == 1
    assert caplog.text.count("no eval_a_bleu...: its declared data is that of the dataset first evaluated") == 1


def test_refused_in_one_line_before_training(tmp_path):
    """Marian's position tables, trainable but left out of every checkpoint (trained, a step's
    score would be of other weights than its checkpoint's: seen as 2 of 40 generations apart),
    when the callback is made, and at an evaluation after one is unfrozen or changed; arguments
    that could give a name another name's data; a second callback on one Trainer."""
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
    table = model.get_parameter("model.decoder.embed_positions.weight")
    table.requires_grad_(True)  # unfrozen afterwards
    with pytest.raises(ConfigError, match=r"model\.decoder\.embed_positions\.weight: trainable"):
        trainer.evaluate()
    table.requires_grad_(False)
    with torch.no_grad():
        table[3, 0] += 1e-3  # changed by hand, frozen
    with pytest.raises(ConfigError, match=r"model\.decoder\.embed_positions\.weight: changed since the callback"):
        trainer.evaluate()
    assert callback.last is None


def test_generation_runs_the_models_own_forward_under_mixed_precision(tmp_path):
    """A Trainer with bf16=True (accelerate's mixed precision) runs the model's forward under
    autocast; evaluate() generates with the model's own forward, in its dtype, as the command line
    runs a checkpoint of it, and leaves the job's forward in place."""
    model, tokenizer = model_and_tokenizer()
    trainer = trainer_of(model, tokenizer, tmp_path, rows(tokenizer, "val", False, 2), {"bf16": True})
    trainer.evaluate()  # the Trainer's loss: accelerate prepares the model
    patched = model.forward
    dtypes: list[torch.dtype] = []
    handle = model.lm_head.register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
    with torch.no_grad():
        model(**tokenizer(["a b"], text_target=["c"], return_tensors="pt"))
    assert dtypes == [torch.bfloat16]  # the job's forward
    dtypes.clear()
    seq2seq_eval.evaluate(model, tokenizer, data_dir=str(DATA), type_path="val", n_obs=2, bs=2, max_new_tokens=4,
                          save_dir=str(tmp_path / "eval"))
    handle.remove()
    assert dtypes and set(dtypes) == {torch.float32}
    assert model.forward == patched and model.forward.__func__ is not type(model).forward


def test_a_half_precision_evaluation_is_the_command_lines_in_that_precision(tmp_path):
    """bf16_full_eval: outside training the Trainer casts its model to bfloat16 (in place) before
    its evaluation; the score is then the command line's with --bf16 on the saved weights."""
    model, tokenizer = model_and_tokenizer()
    trainer = trainer_of(model, tokenizer, tmp_path, rows(tokenizer, "val", True, 3), {"bf16_full_eval": True})
    EvalCallback(trainer, **OPTIONS)
    trainer.save_model(str(tmp_path / "saved"))
    got = trainer.evaluate()
    assert model.dtype == torch.bfloat16
    reference = seq2seq_eval.evaluate(str(tmp_path / "saved"), data_dir=str(DATA), type_path="val", bf16=True,
                                      save_dir=str(tmp_path / "ref"), **{**OPTIONS, "n_obs": 3})
    assert got["eval_bleu"] == reference.metrics["bleu"]


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
