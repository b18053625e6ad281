"""BERTScore (Zhang et al., 2020) natively on transformers, as bert-score 0.3.13's `score()`
computes it: each example's precision, recall and F1 of greedily matched token embeddings of one
layer, per example equal to bert-score's to 1e-5. `encoder` runs the model, `matching` the
greedy matching, `baseline` reads the rescaling baselines, `layers` is bert-score's layer table;
METRIC is what the registry reads."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import ConfigError
from ..model_metric import ModelMetric, ModelMetricSpec, Option, default_budget
from .layers import MODEL_LAYERS

__all__ = ["DEFAULT_MODEL", "METRIC", "BERTScore", "check", "load"]

DEFAULT_MODEL = "roberta-large"
"""bert-score's model for English (its lang2model["en"]), at its layer 17."""
BERT_SCORE_VERSION = "0.3.13"


def num_layers(options: Mapping[str, Any]) -> int:
    """--bertscore_num_layers, or bert-score's layer for a model it knows."""
    model, given = options["bertscore_model"], options["bertscore_num_layers"]
    if given is not None:
        return int(given)
    if model not in MODEL_LAYERS:
        raise ConfigError(f"--bertscore_num_layers is needed for --bertscore_model {model}: bert-score's table has "
                          "no layer for it (it has one for roberta-large, bert-base-uncased, ...: "
                          "docs/metrics.md#bertscore)")
    return MODEL_LAYERS[model]


class BERTScore(ModelMetric):
    name = "bertscore"

    def __init__(self, options: Mapping[str, Any], tokenizer: Any, model: Any, device: Any,
                 baseline: tuple[float, float, float] | None, baseline_kind: str | None) -> None:
        self.model_name = str(options["bertscore_model"])
        self.layers = num_layers(options)
        self.use_idf = bool(options["bertscore_idf"])
        self.tokenizer, self.model, self.device = tokenizer, model, device
        self.baseline, self.baseline_kind = baseline, baseline_kind
        self.idf: dict[int, float] | None = None
        self._unseen = 0.0

    @property
    def signature(self) -> str:
        """bert-score's own hash of the settings (utils.get_hash), then how references combine and this tool."""
        import transformers

        from ... import __version__

        hashed = (f"{self.model_name}_L{self.layers}{'_idf' if self.use_idf else '_no-idf'}"
                  f"_version={BERT_SCORE_VERSION}(hug_trans={transformers.__version__})")
        baseline = ""
        if self.baseline is not None:
            hashed += "-custom-rescaled" if self.baseline_kind == "custom" else "-rescaled"
            # The values themselves: bert-score's hash names neither the language nor the file.
            baseline = "|baseline:" + ",".join(f"{k}={v:g}" for k, v in zip("PRF", self.baseline))
        return f"{hashed}{baseline}|refs:max|seq2seq_eval:{__version__}"

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        from .encoder import token_ids

        return token_ids(self.tokenizer, texts)

    def prepare(self, sources: Sequence[str], predictions: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        """With --bertscore_idf, the weights bert-score's get_idf_dict takes from the references:
        log((N + 1) / (n + 1)) for a token in n of the N references (each reference of each
        example counts), log(N + 1) for one in none."""
        if not self.use_idf:
            return
        flat = [r for refs in references for r in refs]
        counts: dict[int, int] = {}
        for ids in self._ids(flat):
            for t in set(ids):
                counts[t] = counts.get(t, 0) + 1
        self.idf = {t: math.log((len(flat) + 1) / (c + 1)) for t, c in counts.items()}
        self._unseen = math.log(len(flat) + 1)

    def _weights(self, ids: Sequence[int]) -> list[float]:
        if self.idf is None:  # bert-score without idf: 1, and 0 for [SEP] and [CLS]
            special = {self.tokenizer.sep_token_id, self.tokenizer.cls_token_id}
            return [0.0 if t in special else 1.0 for t in ids]
        return [self.idf.get(t, self._unseen) for t in ids]

    def lengths(self, sources: Sequence[str], predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> list[int]:
        flat = [r for refs in references for r in refs]
        ref_lens = iter(len(x) for x in self._ids(flat))
        return [max(len(p), *(next(ref_lens) for _ in refs)) for p, refs in zip(self._ids(predictions), references)]

    def score(self, sources: Sequence[str], predictions: Sequence[str],
              references: Sequence[Sequence[str]], max_tokens: int | None = None) -> list[tuple[float, float, float]]:
        """Per example (F1, precision, recall); with several references each the highest over
        them, as bert-score takes them, then rescaled with the baseline if asked."""
        import torch

        from .encoder import embed
        from .matching import greedy_scores

        if not predictions:
            return []
        if self.use_idf and self.idf is None:
            raise ValueError("BERTScore with idf: prepare() with every reference first")
        budget = default_budget(max_tokens, self.device.type)
        flat = [r for refs in references for r in refs]
        texts = list(dict.fromkeys([*predictions, *flat]))  # each distinct text encoded once
        ids = self._ids(texts)
        emb = embed(self.model, ids, self.tokenizer.pad_token_id, budget, self.device)
        weights = [torch.tensor(self._weights(x), dtype=torch.float32, device=self.device) for x in ids]
        row = {t: i for i, t in enumerate(texts)}
        owner = [i for i, refs in enumerate(references) for _ in refs]
        hyp = [row[predictions[i]] for i in owner]
        ref = [row[r] for r in flat]
        prf = greedy_scores([emb[k] for k in hyp], [emb[k] for k in ref], [weights[k] for k in hyp],
                            [weights[k] for k in ref])
        out = []
        start = 0
        for refs in references:
            best = prf[start:start + len(refs)].max(dim=0)[0]  # P, R and F each at its highest
            start += len(refs)
            if self.baseline is not None:
                base = torch.tensor(self.baseline, dtype=torch.float32, device=best.device)
                best = (best - base) / (1 - base)
            p, r, f = best.double().tolist()
            out.append((f, p, r))
        return out


def check(options: Mapping[str, Any]) -> None:
    """Before any work: the layer is known, the baseline can be read, the model's config is found,
    its tokenizer loads and sets the length texts are cut to (as load() reads them)."""
    from transformers import AutoConfig

    from ...errors import ModelError

    layers = num_layers(options)
    _baseline(options, layers)
    try:
        config = AutoConfig.from_pretrained(options["bertscore_model"])
    except (OSError, ValueError) as e:
        raise ModelError(f"--bertscore_model {options['bertscore_model']}: not found ({type(e).__name__}); expected "
                         "a hub name (or its cached copy with HF_HUB_OFFLINE=1) or a local folder") from e
    # The encoder's layers as its config counts them (load checks the model itself again).
    count = next((getattr(config, k) for k in ("encoder_layers", "num_hidden_layers", "num_layers", "n_layers")
                  if isinstance(getattr(config, k, None), int)), None)
    if count is not None and layers > count:
        raise ConfigError(f"--bertscore_num_layers {layers}: {options['bertscore_model']} has {count} layers; "
                          f"expected 0 to {count}")
    from .encoder import check_model, load_tokenizer

    # So that it fails here, not after generation.
    check_fit(options["bertscore_model"], config, load_tokenizer(options["bertscore_model"]))
    check_model(options["bertscore_model"])


def check_fit(name: str, config: Any, tokenizer: Any) -> None:
    """The tokenizer fits the model: every id it gives within the embeddings' vocab_size rows, and
    a text cut to its model_max_length within the position embeddings (else an IndexError in the
    middle of scoring)."""
    from ...errors import ModelError
    from ..fit import first_problem, ids_past_embeddings, positions_past_embeddings

    rows = getattr(config, "vocab_size", None)
    problem = first_problem(ids_past_embeddings(tokenizer, rows) if isinstance(rows, int) else None,
                            positions_past_embeddings(int(tokenizer.model_max_length), config))
    if problem is not None:
        raise ModelError(f"--bertscore_model {name}: its tokenizer does not fit the model: {problem}")


def _baseline(options: Mapping[str, Any], layers: int) -> tuple[tuple[float, float, float] | None, str | None]:
    # Each baseline option has one use: given where it is not read, it is refused.
    lang_given = options["bertscore_lang"] != "en"
    if not options["bertscore_rescale_with_baseline"]:
        for flag, given in (("bertscore_baseline_path", options["bertscore_baseline_path"] is not None),
                            ("bertscore_lang", lang_given)):
            if given:
                raise ConfigError(f"--{flag} needs --bertscore_rescale_with_baseline")
        return None, None
    if lang_given and options["bertscore_baseline_path"] is not None:
        raise ConfigError("--bertscore_lang picks one of bert-score's baseline files; with --bertscore_baseline_path "
                          "it is not read: leave one of them out")
    from .baseline import baseline_file, read_baseline

    path, kind = baseline_file(options["bertscore_model"], options["bertscore_lang"], options["bertscore_baseline_path"])
    return read_baseline(path, layers), kind


def load(options: Mapping[str, Any], device: Any = "cpu") -> BERTScore:
    import torch

    from .encoder import load_model, load_tokenizer

    layers = num_layers(options)
    baseline, kind = _baseline(options, layers)
    tokenizer = load_tokenizer(options["bertscore_model"])
    model = load_model(options["bertscore_model"], layers, device)
    check_fit(options["bertscore_model"], model.config, tokenizer)  # `score` runs no check first
    return BERTScore(options, tokenizer, model, torch.device(device), baseline, kind)


METRIC = ModelMetricSpec(
    name="bertscore",
    what="BERTScore F1 (--bertscore_model), with precision and recall; the highest over references",
    load=load,
    check=check,
    options=(
        Option("bertscore_model", DEFAULT_MODEL, "with --metrics bertscore: the encoder, a hub name or a folder"),
        Option("bertscore_num_layers", None, "with --metrics bertscore: the layer whose output is matched (default: "
               "bert-score's for a model it knows; needed for any other)", kind=int, valid=lambda v: v >= 0,
               expected="an integer >= 0"),
        Option("bertscore_idf", False, "with --metrics bertscore: weigh tokens by their idf among the references",
               kind=bool),
        Option("bertscore_rescale_with_baseline", False, "with --metrics bertscore: rescale with bert-score's "
               "baseline for the model and --bertscore_lang (read from an installed bert-score)", kind=bool),
        Option("bertscore_lang", "en", "with --bertscore_rescale_with_baseline: the language of the baseline"),
        Option("bertscore_baseline_path", None, "with --bertscore_rescale_with_baseline: a baseline file of one's "
               "own (bert-score's layout: LAYER,P,R,F), instead of bert-score's"),
    ),
    keys=("bertscore", "bertscore_precision", "bertscore_recall"),
    decimals=4,
)
