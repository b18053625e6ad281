"""COMET's unified checkpoints natively on transformers 5: CometKiwi (`unified_metric`, e.g.
Unbabel/wmt22-cometkiwi-da) and XCOMET (`xcomet_metric`, on XLM-R-XL), computed as
unbabel-comet 2.2.7's UnifiedMetric and XCOMETMetric compute them in `predict`.

The translation is joined with the source and/or reference into one input (`<s> mt </s></s>
src </s></s> ref </s>`); the sentence score is the estimator's on the first token of the layer
mix, the error spans come from a linear tagger on one layer (spans.py). With both a source and
a reference there are three inputs, [mt, src], [mt, ref] and [mt, src, ref]: a UnifiedMetric
averages their scores, XCOMET clips each at 1 and weighs them 0.12/0.33/0.33, adds 0.22 times
the MQM score of the spans, and the spans read the three inputs' probabilities weighted
0.1667/0.3333/0.5; with one input (no reference, or a model trained on [mt, src]) that input
alone, XCOMET's clipped score weighted 0.78."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ...numerics import one_mkl_thread
from ..model_metric import ModelMetric, default_budget
from . import spans as span_rules
from .network import LayerMix, encoder_class, feed_forward

UNIFIED, XCOMET = "unified_metric", "xcomet_metric"
DEFAULTS = {
    # Each class's constructor defaults, for a key hparams.yaml does not hold.
    UNIFIED: {"sent_layer": "mix", "layer_transformation": "sparsemax", "layer_norm": True, "word_layer": 24,
              "hidden_sizes": [3072, 1024], "activations": "Tanh", "final_activation": None,
              "input_segments": ["mt", "src", "ref"], "word_level_training": False, "error_labels": ["minor", "major"]},
    XCOMET: {"sent_layer": "mix", "layer_transformation": "sparsemax", "layer_norm": False, "word_layer": 36,
             "hidden_sizes": [2560, 1280], "activations": "Tanh", "final_activation": None,
             "error_labels": ["minor", "major", "critical"]},
}
SPAN_WEIGHTS = (0.1667, 0.3333, 0.5)
"""The three inputs' weights on the label probabilities ([mt, src], [mt, ref], [mt, src, ref])."""
SCORE_WEIGHTS = (0.12, 0.33, 0.33, 0.22)
"""XCOMET's weights on the three inputs' clipped scores and on the MQM score."""


def settings(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The hparams a unified class reads, its defaults filled in. XCOMET always reads all three
    segments and tags words."""
    kind = hparams["class_identifier"]
    out = {**DEFAULTS[kind], **{k: v for k, v in hparams.items() if k in DEFAULTS[kind]}}
    if kind == XCOMET:
        out.update(input_segments=["mt", "src", "ref"], word_level_training=True)
    return out


class UnifiedNetwork(nn.Module):
    """The published parameters under their names (`encoder.model.*`, `layerwise_attention.*`,
    `estimator.ff.*`, `hidden2tag.*`), in inference (dropouts are identities there)."""

    def __init__(self, encoder_config: Any, hparams: Mapping[str, Any]) -> None:
        super().__init__()
        s = settings(hparams)
        self.encoder = nn.Module()
        self.encoder.model = encoder_class(hparams)[1](encoder_config, add_pooling_layer=False)
        self.xl = hparams.get("encoder_model") == "XLM-RoBERTa-XL"
        num_layers = encoder_config.num_hidden_layers + 1
        self.sent_layer = s["sent_layer"]
        self.layerwise_attention = (LayerMix(num_layers, str(s["layer_transformation"]), bool(s["layer_norm"]))
                                    if self.sent_layer == "mix" else None)
        self.estimator = nn.Module()
        self.estimator.ff = feed_forward(encoder_config.hidden_size, list(s["hidden_sizes"]), str(s["activations"]),
                                         s["final_activation"])
        self.word_level = bool(s["word_level_training"])
        self.word_layer = s["word_layer"]
        self.labels = span_rules.labels(s["error_labels"])
        for name, layer in (("sent_layer", self.sent_layer), ("word_layer", self.word_layer if self.word_level else 0)):
            if layer != "mix" and not (isinstance(layer, int) and 0 <= layer < num_layers):
                raise ValueError(f"{name} {layer!r}: expected 'mix' or a layer in 0..{num_layers - 1}")
        if self.word_level:
            self.hidden2tag = nn.Linear(encoder_config.hidden_size, len(self.labels))

    def drop_unused_layers(self) -> int:
        """Removes the encoder layers above the highest output read (the layer mix's highest
        weighted one: sparsemax gives some a weight of exactly 0; the sentence layer; the tagger's
        layer), so they are never run. XLM-R-XL normalizes its last layer's output alone, so its
        layers all stay. Returns how many layers are left."""
        layers = self.encoder.model.encoder.layer
        if self.xl:
            return len(layers)
        if self.layerwise_attention is not None:
            with torch.no_grad():
                top = int(self.layerwise_attention.weights().nonzero().max())
        else:
            top = int(self.sent_layer)
        if self.word_level:
            top = max(top, int(self.word_layer))
        del layers[top:]
        return len(layers)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the sentence scores, the label probabilities per token or None)."""
        layers = self.encoder.model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
        emb = self.layerwise_attention(layers, mask) if self.layerwise_attention is not None else layers[self.sent_layer]
        # The estimator's layers and the tagger (a few labels wide) are the narrow products MKL's
        # strict mode leaves depending on its threads (numerics.one_mkl_thread), as in network.py.
        with one_mkl_thread():
            scores = self.estimator.ff(emb[:, 0, :]).view(-1)  # the first token's embedding
            probs = torch.softmax(self.hidden2tag(layers[self.word_layer]), dim=2) if self.word_level else None
        return scores, probs


class UnifiedComet(ModelMetric):
    """A loaded unified checkpoint: per example its score, and with a word-level model its error
    spans (a tuple of both)."""

    name = "comet"

    def __init__(self, model_name: str, hparams: Mapping[str, Any], network: UnifiedNetwork, tokenizer: Any,
                 max_positions: int, device: Any) -> None:
        self.model_name, self.kind, self.network, self.tokenizer = model_name, hparams["class_identifier"], network, tokenizer
        self.max_positions = max_positions  # the encoder's positions less 2, COMET's max_positions
        self.device = device
        self.segments = list(settings(hparams)["input_segments"])

    @property
    def signature(self) -> str:
        from ... import __version__

        return f"model:{self.model_name}|class:{self.kind}|seq2seq_eval:{__version__}"

    @property
    def reads_references(self) -> bool:
        return "ref" in self.segments

    def _tokenize(self, texts: Sequence[str]) -> Any:
        # COMET's prepare_sample: each segment alone, cut to max_positions - 2 tokens, specials kept.
        return self.tokenizer(list(texts), truncation=True, max_length=self.max_positions - 2,
                              return_offsets_mapping=True)

    def _inputs(self, sources: Sequence[str], predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> tuple[list[list[list[int]]], Any]:
        """Per example the joined inputs it is scored on (one, or three), and the translations'
        tokenization (the spans read its offsets)."""
        refs = [tuple(r) for r in references] if self.reads_references else [() for _ in predictions]
        many = [i for i, r in enumerate(refs) if len(r) > 1]
        if many:
            from ...errors import DataError

            raise DataError(f"--comet_model {self.model_name}: {self.kind} reads one reference per example; the "
                            f"example at position {many[0]} has {len(refs[many[0]])}; give one reference stream")
        mt = self._tokenize(predictions)
        pad = self.tokenizer.pad_token_id
        # COMET drops every pad id before joining (a text's literal "<pad>" too).
        strip = lambda ids: [t for t in ids if t != pad]  # noqa: E731
        src = [strip(x) for x in self._tokenize(sources)["input_ids"]] if "src" in self.segments else None
        flat = [r[0] for r in refs if r]
        ref_ids = iter(strip(x) for x in self._tokenize(flat)["input_ids"]) if flat else iter(())
        out = []
        for i, ids in enumerate(mt["input_ids"]):
            m = strip(ids)
            r = next(ref_ids) if refs[i] else None
            if src is not None and r is not None:
                out.append([self._join([m, src[i]]), self._join([m, r]), self._join([m, src[i], r])])
            else:
                out.append([self._join([m, *(x for x in (src[i] if src is not None else None, r) if x is not None)])])
        return out, mt

    def _join(self, segments: list[list[int]]) -> list[int]:
        """COMET's concat_sequences: `<s> a </s></s> b </s>` ..., cut to max_positions when the
        segments' tokens exceed max_positions - 1 - 2 x segments (the end token may go)."""
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        seq = segments[0]
        for s in segments[1:]:
            seq = [cls, *seq[1:-1], sep, sep, *s[1:-1], sep]
        if sum(len(s) - 2 for s in segments) > self.max_positions - (1 + 2 * len(segments)):
            seq = seq[: self.max_positions]
        return seq

    def lengths(self, sources: Sequence[str], predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> list[int]:
        return [max(len(x) for x in rows) for rows in self._inputs(sources, predictions, references)[0]]

    def _forward(self, rows: list[list[int]], max_tokens: int) -> tuple[list[Any], list[Any]]:
        """Every row's score and label probabilities: rows longest first, cut into passes of at
        most `max_tokens` padded tokens (rows of every example and input side by side)."""
        order = sorted(range(len(rows)), key=lambda i: (-len(rows[i]), i))
        pad = self.tokenizer.pad_token_id
        scores: list[Any] = [None] * len(rows)
        probs: list[Any] = [None] * len(rows)
        start = 0
        while start < len(order):
            width = len(rows[order[start]])
            chunk = order[start:start + max(1, max_tokens // max(width, 1))]
            ids = torch.tensor([rows[i] + [pad] * (width - len(rows[i])) for i in chunk], device=self.device)
            mask = torch.tensor([[1] * len(rows[i]) + [0] * (width - len(rows[i])) for i in chunk], device=self.device)
            s, p = self.network(ids, mask)
            # One copy per pass (not per row) to where the values are combined.
            s, p = s.float().cpu(), (p.float().cpu() if p is not None else None)
            for j, i in enumerate(chunk):
                scores[i] = s[j]
                probs[i] = p[j] if p is not None else None
            start += len(chunk)
        return scores, probs

    def score(self, sources: Sequence[str], predictions: Sequence[str],
              references: Sequence[Sequence[str]], max_tokens: int | None = None) -> list[Any]:
        if not predictions:
            return []
        inputs, mt = self._inputs(sources, predictions, references)
        rows = [row for example in inputs for row in example]
        with torch.inference_mode():
            scores, probs = self._forward(rows, default_budget(max_tokens, self.device.type))
        out, k = [], 0
        for i, example in enumerate(inputs):
            n = len(example)
            s, p = scores[k:k + n], probs[k:k + n]
            k += n
            out.append(self._combine(s, p, mt["input_ids"][i], mt["offset_mapping"][i], example[0]))
        return out

    def _combine(self, scores: list[Any], probs: list[Any], mt_ids: list[int], offsets: list[Any],
                 first: list[int]) -> Any:
        """One example's value from its inputs' scores and probabilities, in predict_step's order
        of float32 operations."""
        found = None
        if self.network.word_level:
            length = len(offsets)  # the translation's tokens, specials included, lead every input
            weights = torch.tensor(SPAN_WEIGHTS) if len(probs) == 3 else None
            mixed = (torch.stack([q[:length] * w for q, w in zip(probs, weights)]).sum(dim=0)
                     if weights is not None else probs[0][:length])
            found = span_rules.decode(mixed, first[:length], [tuple(o) for o in offsets], self.network.labels,
                                      self.tokenizer.decode)
        if self.kind == XCOMET:
            clipped = [torch.where(x > 1.0, 1.0, x) for x in scores]
            mqm = (torch.tensor([span_rules.mqm(found)]) * -1 + 25) / 25
            if len(scores) == 3:
                regression = torch.stack([c * w for c, w in zip(clipped, SCORE_WEIGHTS[:3])]).sum(dim=0)
            else:
                regression = clipped[0] * sum(SCORE_WEIGHTS[:3])
            value = float((regression + mqm * SCORE_WEIGHTS[3])[0])
        else:
            value = float(torch.stack(scores).mean(dim=0)) if len(scores) == 3 else float(scores[0])
        return (value, found) if found is not None else value

