"""EvalCallback on Trainer subclasses and datasets it cannot read the call of: every score is
under the name of the loss beside it, of the rows that loss is of, with the generation settings
that evaluation was given; where it cannot know, no score under any name and one warning. Each
case is compared with evaluate() on the same in-memory model and the rows the case evaluates (one
untrained model, evaluations at step 0: no training needed to tell data apart)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                          Seq2SeqTrainingArguments)

import seq2seq_eval
from seq2seq_eval import EvalCallback
from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL
from seq2seq_eval.errors import ConfigError

datasets = pytest.importorskip("datasets")

DATA = EMBEDDED_DATA["translation"]
N = 6
OPTIONS = dict(bs=8, num_beams=2, max_new_tokens=16)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tokenizer = AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL))
    model = AutoModelForSeq2SeqLM.from_pretrained(str(EMBEDDED_MODEL))
    for name, param in model.named_parameters():
        if "embed_positions" in name:  # trainable, never in a checkpoint: refused otherwise
            param.requires_grad_(False)
    root = tmp_path_factory.mktemp("subclasses")
    cache: dict = {}

    def reference(texts: list[tuple[str, str]], **settings) -> float:
        """evaluate() on the model itself with those examples: what the score must be."""
        key = (tuple(texts), tuple(sorted(settings.items())))
        if key not in cache:
            cache[key] = seq2seq_eval.evaluate(
                model, tokenizer, sources=[s for s, _ in texts], references=[t for _, t in texts],
                save_dir=str(root / f"ref{len(cache)}"), **{**OPTIONS, **settings}).metrics["bleu"]
        return cache[key]

    return model, tokenizer, reference, root


def texts(split: str, n: int = N) -> list[tuple[str, str]]:
    src = (DATA / f"{split}.source").read_text().splitlines()[:n]
    tgt = (DATA / f"{split}.target").read_text().splitlines()[:n]
    return list(zip(src, tgt))


def rows(tokenizer, pairs: list[tuple[str, str]], text: bool = True) -> list[dict]:
    return [dict(tokenizer(s, text_target=t), **({"source": s, "target": t, "id": i} if text else {}))
            for i, (s, t) in enumerate(pairs)]


def table(tokenizer, pairs: list[tuple[str, str]]):
    """A datasets.Dataset with text columns and the model's columns."""
    return datasets.Dataset.from_list(rows(tokenizer, pairs))


def trainer_of(cls, model, tokenizer, out: Path, eval_dataset, **arguments):
    args = Seq2SeqTrainingArguments(output_dir=str(out), use_cpu=True, per_device_eval_batch_size=4, report_to=[],
                                    dataloader_num_workers=0, disable_tqdm=True, **arguments)
    return cls(model=model, args=args, eval_dataset=eval_dataset, processing_class=tokenizer,
               data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))


# ---------------------------------------------------------------- subclasses: pass-through

class LoopArgs(Seq2SeqTrainer):
    def evaluation_loop(self, *args, **kwargs):
        return super().evaluation_loop(*args, **kwargs)


class PassThrough(Seq2SeqTrainer):
    """Every method the callback could read a call from, overridden without a signature; the loop
    under transformers 4's name (prediction_loop), which a subclass kept and delegates to."""

    def evaluate(self, *args, **kwargs):
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        return super().predict(*args, **kwargs)

    def get_eval_dataloader(self, *args, **kwargs):
        return super().get_eval_dataloader(*args, **kwargs)

    def get_test_dataloader(self, *args, **kwargs):
        return super().get_test_dataloader(*args, **kwargs)

    def evaluation_loop(self, *args, **kwargs):
        return self.prediction_loop(*args, **kwargs)

    def prediction_loop(self, *args, **kwargs):
        return super().evaluation_loop(*args, **kwargs)


@pytest.mark.parametrize("cls", [LoopArgs, PassThrough])
def test_a_pass_through_subclass_scores_each_call_under_its_own_name(cls, setup, caplog):
    """Finding 2: predict(test) and evaluate(eval_dataset=test, metric_key_prefix="x") on a
    subclass whose overrides hide the call's arguments: test's score under the call's name."""
    model, tokenizer, reference, root = setup
    out = root / cls.__name__
    val, test = texts("val"), texts("test")
    trainer = trainer_of(cls, model, tokenizer, out, rows(tokenizer, val))
    EvalCallback(trainer, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        predicted = trainer.predict(rows(tokenizer, test)).metrics
        other = trainer.evaluate(eval_dataset=rows(tokenizer, test), metric_key_prefix="x")
        plain = trainer.evaluate()
    assert reference(val) != reference(test)
    assert predicted["test_bleu"] == other["x_bleu"] == reference(test)
    assert plain["eval_bleu"] == reference(val)
    assert not any(k.startswith("eval") for k in {**predicted, **other})
    assert "EvalCallback" not in caplog.text


# ---------------------------------------------------------------- subclasses: real changes

class EvalSubset(Seq2SeqTrainer):  # finding 3: 3 of the rows
    def get_eval_dataloader(self, eval_dataset=None):
        return super().get_eval_dataloader(self.eval_dataset.select(range(3)))


class SubsetOfTest(Seq2SeqTrainer):
    def get_test_dataloader(self, test_dataset):
        return super().get_test_dataloader(test_dataset.select([1, 3, 5]))


class PredictSubset(Seq2SeqTrainer):
    def predict(self, test_dataset, *args, **kwargs):
        return super().predict(test_dataset.select(range(2, 6)), *args, **kwargs)


class LoopPrefix(Seq2SeqTrainer):
    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        return super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, "other")


class LoopOtherData(Seq2SeqTrainer):
    def evaluation_loop(self, dataloader, *args, **kwargs):
        return super().evaluation_loop(self.get_test_dataloader(self.other), *args, **kwargs)


class EvaluatePrefix(Seq2SeqTrainer):
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", **gen_kwargs):
        return super().evaluate(eval_dataset, ignore_keys, "dev", **gen_kwargs)


class TorchSubset(Seq2SeqTrainer):  # its own DataLoader over a torch Subset of the rows as given
    def get_eval_dataloader(self, eval_dataset=None):
        rows_ = list(self.eval_dataset)
        subset = torch.utils.data.Subset(rows_, [0, 2, 4])
        return torch.utils.data.DataLoader(subset, batch_size=4, collate_fn=self._get_collator_with_removed_columns(
            self.data_collator, "Evaluation"))


def _split(pairs, which):
    return [pairs[i] for i in which]


@pytest.mark.parametrize("cls, call, name, expected", [
    (EvalSubset, "evaluate", "eval", ("val", range(3))),
    (SubsetOfTest, "predict", "test", ("test", [1, 3, 5])),
    (PredictSubset, "predict", "test", ("test", range(2, 6))),
    (LoopPrefix, "evaluate", "other", ("val", range(N))),
    (LoopOtherData, "evaluate", "eval", ("train", range(4))),
    (EvaluatePrefix, "evaluate", "dev", ("val", range(N))),
    (TorchSubset, "evaluate", "eval", ("val", [0, 2, 4])),
])
def test_a_subclass_that_changes_the_rows_or_the_name(cls, call, name, expected, setup, caplog):
    """The score is of the rows the loop iterated, under the name of its loss, and the loss
    beside it is the plain Trainer's on those rows."""
    model, tokenizer, reference, root = setup
    out = root / f"{cls.__name__}_{call}"
    val, test = texts("val"), texts("test")
    data = {"val": val, "test": test, "train": texts("train", 4)}
    trainer = trainer_of(cls, model, tokenizer, out, table(tokenizer, val))
    trainer.other = table(tokenizer, data["train"])
    if cls is TorchSubset:
        trainer.eval_dataset = rows(tokenizer, val)
    EvalCallback(trainer, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        got = trainer.evaluate() if call == "evaluate" else trainer.predict(table(tokenizer, test)).metrics
    pairs = _split(data[expected[0]], expected[1])
    assert got[f"{name}_bleu"] == reference(pairs)
    plain = trainer_of(Seq2SeqTrainer, model, tokenizer, root / "plain", None)
    assert got[f"{name}_loss"] == pytest.approx(plain.evaluate(eval_dataset=rows(tokenizer, pairs))["eval_loss"])
    assert [k for k in got if k.endswith("_bleu")] == [f"{name}_bleu"]
    assert "EvalCallback" not in caplog.text


# ---------------------------------------------------------------- what it cannot know

class Bypass(Seq2SeqTrainer):
    """Runs the Trainer's loop without self.evaluation_loop (the callback's)."""

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", **gen_kwargs):
        output = Seq2SeqTrainer.evaluation_loop(self, self.get_eval_dataloader(eval_dataset), "Evaluation",
                                                metric_key_prefix=metric_key_prefix)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, output.metrics)
        return output.metrics


class Renamed(Seq2SeqTrainer):
    """Its loop's keys under no one prefix."""

    def evaluation_loop(self, *args, **kwargs):
        output = super().evaluation_loop(*args, **kwargs)
        output.metrics["loss_of_mine"] = output.metrics.pop(next(k for k in output.metrics if k.endswith("_loss")))
        return output


class NoEvent(Seq2SeqTrainer):
    """A loop whose keys say no name (cleared), under an evaluate() that fires no on_evaluate
    event (where evaluate() adds its speed metrics under the prefix)."""

    def evaluation_loop(self, *args, **kwargs):
        output = super().evaluation_loop(*args, **kwargs)
        output.metrics.clear()
        return output

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", **gen_kwargs):
        return self.evaluation_loop(self.get_eval_dataloader(eval_dataset), "Evaluation",
                                    metric_key_prefix=metric_key_prefix).metrics


class Sampled(Seq2SeqTrainer):
    """A sampler that draws rows with replacement: which ones, the callback cannot know without
    drawing (and moving the job's random state)."""

    def get_eval_dataloader(self, eval_dataset=None):
        rows_ = self.eval_dataset
        return torch.utils.data.DataLoader(
            rows_, batch_size=2, sampler=torch.utils.data.RandomSampler(rows_, replacement=True, num_samples=4),
            collate_fn=self._get_collator_with_removed_columns(self.data_collator, "Evaluation"))


@pytest.mark.parametrize("cls, arguments, message", [
    (Bypass, {}, "an evaluation (eval_loss"),
    (Renamed, {}, "an evaluation's name is not known: its keys are epoch, eval_model_preparation_time"),
    (NoEvent, {}, "an evaluation's name is not known: its keys are none"),
    (Sampled, {}, "no eval_bleu...: the rows the Trainer evaluated as 'eval' are not known: its sampler"),
    (Seq2SeqTrainer, {"dataloader_drop_last": True}, "not known: its dataloader drops the last batch"),
])
def test_what_it_cannot_see_gets_no_score_and_one_warning(cls, arguments, message, setup, caplog):
    model, tokenizer, _, root = setup
    trainer = trainer_of(cls, model, tokenizer, root / f"blind_{cls.__name__}", rows(tokenizer, texts("val", 5)),
                         **arguments)
    EvalCallback(trainer, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        got = [trainer.evaluate() for _ in range(2)]
    assert not any(k.endswith("_bleu") for m in got for k in m)
    assert any("loss" in k for k in got[0]) or cls is NoEvent
    assert caplog.text.count(message) == 1, caplog.text
    assert not (root / f"blind_{cls.__name__}" / "seq2seq_eval").exists()


def test_declared_data_of_other_rows_than_the_loops_gets_no_score(setup, caplog):
    """Finding 3 with declared data: the subclass evaluates 3 of the 6 rows, the files declared
    for "eval" give 6 examples: the loss and a score would be of other examples."""
    model, tokenizer, reference, root = setup
    trainer = trainer_of(EvalSubset, model, tokenizer, root / "declared", table(tokenizer, texts("val")))
    EvalCallback(trainer, data_dir=str(DATA), type_path="val", n_obs=N, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        got = [trainer.evaluate() for _ in range(2)]
    assert not any(k.endswith("_bleu") for m in got for k in m) and "eval_loss" in got[0]
    assert caplog.text.count("no eval_bleu...: the Trainer evaluated 3 rows as 'eval', the data declared for it "
                             "gives 6 examples (n_obs=6); declare data of those rows") == 1


# ---------------------------------------------------------------- datasets as stored

def _tokenize(tokenizer):
    def transform(batch):
        return dict(tokenizer(batch["source"], text_target=batch["target"]))
    return transform


@pytest.mark.parametrize("shape", ["set_transform", "torch", "format_columns", "shuffled_selection"])
def test_datasets_are_read_as_stored(shape, setup, caplog):
    """Finding 5: a datasets.Dataset whose format or transform shows the Trainer other columns
    than it stores (set_transform(tokenize) with remove_unused_columns=False, with_format("torch"),
    set_format(columns=...)), or a selection of shuffled rows: scored on its stored texts."""
    model, tokenizer, reference, root = setup
    val = texts("val")
    arguments: dict = {}
    expected = val
    if shape == "set_transform":
        dataset = datasets.Dataset.from_dict({"source": [s for s, _ in val], "target": [t for _, t in val],
                                              "id": list(range(N))})
        dataset.set_transform(_tokenize(tokenizer))
        arguments["remove_unused_columns"] = False
    elif shape == "torch":
        dataset = table(tokenizer, val).with_format("torch")
    elif shape == "format_columns":
        dataset = table(tokenizer, val)
        dataset.set_format(columns=["input_ids", "attention_mask", "labels"])
        arguments["remove_unused_columns"] = False
    else:
        dataset = table(tokenizer, val).shuffle(seed=3).select(range(4))
        expected = [(r["source"], r["target"]) for r in dataset]
    trainer = trainer_of(Seq2SeqTrainer, model, tokenizer, root / f"stored_{shape}", dataset, **arguments)
    EvalCallback(trainer, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        got = trainer.evaluate()
    assert got["eval_bleu"] == reference(expected)
    assert "EvalCallback" not in caplog.text


# ---------------------------------------------------------------- folders and settings

def test_each_evaluation_has_a_folder_of_its_own(setup):
    """Finding 4: three predictions on other data at one step, and a repeat of the first (the
    same result, no new folder): three folders, each with its own generations."""
    model, tokenizer, reference, root = setup
    out = root / "folders"
    trainer = trainer_of(LoopArgs, model, tokenizer, out, None)
    EvalCallback(trainer, **OPTIONS)
    parts = [texts("val", 3), texts("test", 4), texts("train", 5)]
    got = [trainer.predict(rows(tokenizer, p), metric_key_prefix="x").metrics["x_bleu"] for p in parts]
    assert trainer.predict(rows(tokenizer, parts[0]), metric_key_prefix="x").metrics["x_bleu"] == got[0]
    assert got[0] == reference(parts[0])
    folders = sorted(p.name for p in (out / "seq2seq_eval" / "x").iterdir())
    assert folders == ["step_0", "step_0_2", "step_0_3"]
    for folder, part in zip(("step_0", "step_0_2", "step_0_3"), parts):
        generations = (out / "seq2seq_eval" / "x" / folder / "test_generations.txt").read_text().splitlines()
        assert len(generations) == len(part)


def _settings(folder: Path) -> dict:
    """The generate() options an evaluation ran with, as its metric file records them."""
    return json.loads((folder / "test_bleu.json").read_text())["provenance"]["config"]["generate_kwargs"]


def test_the_calls_generation_settings_are_honoured_or_refused(setup, caplog):
    """Finding 6: evaluate(num_beams=1, max_new_tokens=8) on a callback made with num_beams=2 and
    max_new_tokens=16 generates again with the call's settings, as does Seq2SeqTrainingArguments'
    generation_max_length (max_length, in place of the callback's max_new_tokens); a setting
    generate() does not take is refused in one line."""
    model, tokenizer, reference, root = setup
    val = texts("val")
    short, long = reference(val, num_beams=1, max_new_tokens=8), reference(val)
    assert short != long
    out = root / "settings"
    trainer = trainer_of(Seq2SeqTrainer, model, tokenizer, out, rows(tokenizer, val), predict_with_generate=True)
    EvalCallback(trainer, **OPTIONS)
    assert trainer.evaluate()["eval_bleu"] == long
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        assert trainer.evaluate(num_beams=1, max_new_tokens=8)["eval_bleu"] == short
        trainer.evaluate(num_beams=1, max_new_tokens=8)
    assert caplog.text.count("EvalCallback: the Trainer's evaluation gives num_beams=1") == 1
    assert caplog.text.count("gives max_new_tokens=8 (the call's, or its arguments' generation_*), in place of the "
                             "callback's max_new_tokens=16") == 1
    assert trainer.evaluate()["eval_bleu"] == long  # the next call's own settings
    folders = out / "seq2seq_eval" / "eval"
    assert [_settings(folders / f) for f in ("step_0", "step_0_2")] == \
        [{"num_beams": 2, "max_new_tokens": 16}, {"num_beams": 1, "max_new_tokens": 8}]
    out = root / "settings_args"
    by_arguments = trainer_of(Seq2SeqTrainer, model, tokenizer, out, rows(tokenizer, val), generation_max_length=6,
                              generation_num_beams=1)
    EvalCallback(by_arguments, **OPTIONS)
    assert by_arguments.evaluate()["eval_bleu"] == reference(val, num_beams=1, max_new_tokens=None, max_length=6)
    assert _settings(out / "seq2seq_eval" / "eval" / "step_0") == {"max_length": 6, "num_beams": 1}
    with pytest.raises(ConfigError, match="unknown generate option --no_such_option") as refused:
        trainer.evaluate(no_such_option=3)
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"^EvalCallback: n_obs: given to the Trainer's evaluate\(\)/predict\(\), "
                                          r"which hands it to generate\(\), and not a generate\(\) option; give it "
                                          r"to EvalCallback$"):
        trainer.evaluate(n_obs=2)


# ---------------------------------------------------------------- the readers, case by case

@pytest.mark.parametrize("keys, computed, suffixes, name", [
    (["eval_loss"], [], "loop", "eval"),
    (["eval_a_loss", "eval_a_bleu"], ["bleu"], "loop", "eval_a"),
    (["eval_x_loss"], ["x_loss"], "loop", "eval"),  # compute_metrics' "x_loss", the loop no loss
    (["eval_x_loss"], [], "loop", "eval_x"),
    (["eval_loss", "eval_x_loss"], ["x_loss"], "loop", "eval"),
    (["eval_loss", "eval_model_preparation_time"], [], "loop", "eval"),
    ([], [], "loop", None),
    (["eval_bleu"], ["eval_bleu"], "loop", None),  # no key of the loop's own
    (["eval_loss", "foo"], [], "loop", None),
    (["a_loss", "b_loss"], [], "loop", None),
    (["epoch", "test_runtime", "test_samples_per_second", "test_steps_per_second"], [], "event", "test"),
    (["epoch", "test_runtime"], [], "loop", None),
])
def test_the_name_is_the_prefix_of_the_keys(keys, computed, suffixes, name):
    from seq2seq_eval.trainer_view import EVENT_SUFFIXES, LOOP_SUFFIXES, name_of

    chosen = EVENT_SUFFIXES if suffixes == "event" else LOOP_SUFFIXES
    assert name_of(dict.fromkeys(keys, 1.0), computed, chosen) == name


def test_the_rows_a_dataloader_gives():
    from seq2seq_eval.trainer_view import dataset_key, examples_of, rows_of

    data = torch.utils.data
    five = [{"source": f"s{i}", "target": f"t{i}"} for i in range(5)]
    table_ = datasets.Dataset.from_list(five)
    table_.set_transform(lambda batch: {"n": [len(s) for s in batch["source"]]})
    stored = {}

    class Stream(data.IterableDataset):
        def __iter__(self):
            return iter(five)

    cases = [
        (data.DataLoader(five, batch_size=2), None),
        (data.DataLoader(five, batch_size=2, sampler=data.SubsetRandomSampler([3, 1])), (1, 3)),
        (data.DataLoader(data.Subset(five, [4, 0, 2]), batch_size=2), (4, 0, 2)),
        (data.DataLoader(data.Subset(five, [4, 0, 2]), sampler=data.SubsetRandomSampler([2, 0])), (4, 2)),
        (data.DataLoader(five[:4], batch_size=2, drop_last=True), None),  # nothing to drop
        (data.DataLoader(table_, batch_size=2, shuffle=True), None),  # a permutation of every row
    ]
    for loader, indices in cases:
        rows = rows_of(loader, stored, 1)
        assert rows.why is None and rows.indices == indices, (loader, rows)
    from transformers.trainer_pt_utils import LengthGroupedSampler

    grouped = LengthGroupedSampler(2, lengths=[3, 1, 4, 1, 5])
    assert rows_of(data.DataLoader(five, batch_size=2, sampler=grouped), stored, 1).indices is None
    # The same select() made again is the same rows (a subclass makes it at each evaluation).
    plain = datasets.Dataset.from_list(five)
    assert dataset_key(plain.select(range(3)), None) == dataset_key(plain.select(range(3)), None)
    assert dataset_key(plain.select(range(3)), None) != dataset_key(plain.select(range(2)), None)
    assert dataset_key(five, None) != dataset_key(list(five), None)  # a list is known as the object
    assert examples_of(table_, (4, 1)) == {"sources": ["s4", "s1"], "references": ["t4", "t1"]}
    assert examples_of(five, (2,)) == {"sources": ["s2"], "references": ["t2"]}
    for loader, why in [
        (None, "not the Trainer's own"),
        (data.DataLoader(Stream()), "reads Stream, which has no rows to count"),
        (data.DataLoader(five, batch_size=2, drop_last=True), "drops the last batch"),
        (data.DataLoader(five, sampler=data.RandomSampler(five, replacement=True)), "sampler (RandomSampler)"),
        (data.DataLoader(five, sampler=data.SubsetRandomSampler([1, 1])), "draws a row twice"),
        (data.DataLoader(five, sampler=data.WeightedRandomSampler([1.0] * 5, 5)), "WeightedRandomSampler"),
        (data.DataLoader(five, batch_sampler=[[0, 1], [3]]), "its batch sampler (list)"),
    ]:
        assert why in rows_of(loader, stored, 1).why
    assert "drops the last batch" in rows_of(data.DataLoader(five[:4], batch_size=2, drop_last=True), stored, 3).why
