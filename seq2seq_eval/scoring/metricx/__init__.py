"""MetricX-24 (hybrid) and MetricX-23 (Juraska et al., 2023, 2024) natively on transformers 5, as
google-research/metricx's `predict.py` and `MT5ForRegression` compute them: the input text of the
version (`source: S candidate: C reference: R` for 24; `candidate: C reference: R` or
`candidate: C source: S` for 23), tokenized with truncation to --metricx_max_length, its last
token (the end token) removed, one decoder step from id 0, the logit of id 250089 clamped to
[0, 25]. Lower is better (an error scale). Inputs are padded and batched here (the official
script does not pad: it scores one example per batch); per example the score equals the
official code's to 1e-5 on its 25-point scale. METRIC is what the registry reads."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError, ModelError
from ..model_metric import ModelMetric, ModelMetricSpec, Option, default_budget, forward_passes

__all__ = ["METRIC", "MetricX", "load"]

DEFAULT_MODEL = "google/metricx-24-hybrid-xl-v2p6"
DEFAULT_TOKENIZER = "google/mt5-xl"
"""The tokenizer the official code loads: MetricX's checkpoints ship none."""
MAX_LENGTH = {"24": 1536, "23": 1024}
"""The official README's --max_input_length per version."""
SCORE_ID = 250089
"""<extra_id_10> in mT5's vocabulary: the logit MT5ForRegression reads as the score."""
TOKENIZER_FILES = ("tokenizer.json", "spiece.model")
CHECKPOINT_FILES = ["config.json", "*.safetensors", "*.json", "*.bin"]
"""What a hub checkpoint's download takes."""
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _text(version: str, qe: bool, source: str, candidate: str, reference: str) -> str:
    """predict.py's _make_input, per version."""
    if version == "24":
        return f"source: {source} candidate: {candidate}" + ("" if qe else f" reference: {reference}")
    return f"candidate: {candidate}" + (f" source: {source}" if qe else f" reference: {reference}")


class MetricX(ModelMetric):
    name = "metricx"

    def __init__(self, options: Mapping[str, Any], network: Any, score_row: Any, scale: float, tokenizer: Any,
                 pad_id: int, device: Any) -> None:
        self.model_name, self.tokenizer_name = str(options["metricx_model"]), str(options["metricx_tokenizer"])
        self.version, self.qe = options["metricx_version"], bool(options["metricx_qe"])
        self.max_length = options["metricx_max_length"] or MAX_LENGTH[self.version]
        self.network, self.score_row, self.scale = network, score_row, scale
        self.tokenizer, self.pad_id, self.device = tokenizer, pad_id, device

    @property
    def signature(self) -> str:
        from ... import __version__

        # What was read: the mean over references, or (QE) none, so no refs part.
        refs = "" if self.qe else "|refs:mean"
        return (f"model:{self.model_name}|tokenizer:{self.tokenizer_name}|version:{self.version}|qe:{self.qe}"
                f"|max_length:{self.max_length}{refs}|seq2seq_eval:{__version__}")

    def _inputs(self, sources: Sequence[str], predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> tuple[list[list[int]], list[int]]:
        """Every input's token ids (one per reference, or one per example with --metricx_qe) and
        the example each belongs to."""
        texts, owner = [], []
        for i, (s, c, refs) in enumerate(zip(sources, predictions, references)):
            if not self.qe and not refs:
                raise ValueError("MetricX without --metricx_qe needs at least one reference per example")
            for r in ([""] if self.qe else refs):
                texts.append(_text(self.version, self.qe, s, c, r))
                owner.append(i)
        ids = self.tokenizer(texts, max_length=self.max_length, truncation=True)["input_ids"] if texts else []
        # predict.py's _remove_eos: the last token after truncation, the end token.
        return [x[:-1] for x in ids], owner

    def lengths(self, sources: Sequence[str], predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> list[int]:
        ids, owner = self._inputs(sources, predictions, references)
        out = [0] * len(predictions)
        for x, i in zip(ids, owner):
            out[i] = max(out[i], len(x))
        return out

    def score(self, sources: Sequence[str], predictions: Sequence[str],
              references: Sequence[Sequence[str]], max_tokens: int | None = None) -> list[float]:
        """Per example the score, the mean over its references (one input with --metricx_qe)."""
        import torch

        if not predictions:
            return []
        ids, owner = self._inputs(sources, predictions, references)
        values = [0.0] * len(ids)
        with torch.inference_mode():
            for rows in forward_passes([len(x) for x in ids], default_budget(max_tokens, self.device.type)):
                width = max(1, len(ids[rows[0]]))
                input_ids = torch.tensor([ids[i] + [self.pad_id] * (width - len(ids[i])) for i in rows], device=self.device)
                mask = torch.tensor([[1] * len(ids[i]) + [0] * (width - len(ids[i])) for i in rows], device=self.device)
                hidden = self.network.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
                start = torch.zeros((len(rows), 1), dtype=torch.long, device=self.device)
                out = self.network.decoder(input_ids=start, encoder_hidden_states=hidden,
                                           encoder_attention_mask=mask).last_hidden_state[:, 0]
                # MT5ForRegression: lm_head(out)[:, 250089], that one row of lm_head alone (a
                # tied head scales the output first); clamped to [0, 25].
                logit = torch.nn.functional.linear(out * self.scale if self.scale != 1.0 else out, self.score_row)
                for i, v in zip(rows, torch.clamp(logit[:, 0], 0, 25).double().tolist()):
                    values[i] = v
        sums, counts = [0.0] * len(predictions), [0] * len(predictions)
        for i, v in zip(owner, values):
            sums[i] += v
            counts[i] += 1
        return [s / n for s, n in zip(sums, counts)]


def _folder(name_or_path: str, flag: str, patterns: Sequence[str]) -> Path:
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path, allow_patterns=list(patterns)))
    except Exception as e:  # the hub's errors have no common base worth naming
        raise ModelError(f"--{flag} {name_or_path}: not a local folder and not found on the hub or in its cache "
                         f"({type(e).__name__})") from e


def _config(folder: Path, name: str) -> dict[str, Any]:
    """config.json as written (transformers 5's MT5Config forces tie_word_embeddings True, which
    MetricX's checkpoints, with their own lm_head, do not have)."""
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"--metricx_model {name}: {path} is missing or not JSON ({type(e).__name__})") from e
    arch = raw.get("architectures") or []
    if not isinstance(raw, dict) or raw.get("model_type") not in ("mt5", "t5") or not any(
            a in ("MT5ForRegression", "MT5ForConditionalGeneration", "T5ForConditionalGeneration") for a in arch):
        raise ModelError(f"--metricx_model {name}: config.json has model_type {raw.get('model_type')!r}, architectures "
                         f"{arch}; expected an mT5 regression checkpoint (MT5ForRegression)")
    if not isinstance(raw.get("vocab_size"), int) or raw["vocab_size"] <= SCORE_ID:
        raise ModelError(f"--metricx_model {name}: vocab_size {raw.get('vocab_size')}; expected above {SCORE_ID} "
                         "(the score is the logit of id 250089)")
    if not any((folder / f).exists() for f in WEIGHT_FILES):
        raise ModelError(f"--metricx_model {name}: no weights in {folder}; expected one of {', '.join(WEIGHT_FILES)}")
    return raw


def _network(raw: Mapping[str, Any]) -> Any:
    """MT5Model of config.json's sizes on the meta device: no values, built in an instant at any size."""
    import torch
    from transformers import MT5Config, MT5Model

    config = MT5Config.from_dict({k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype", "dtype")})
    config.use_cache = False
    config._attn_implementation = "eager"  # as MetricX's transformers 4.30 computes attention
    with torch.device("meta"):
        return MT5Model(config)


def _weight_paths(folder: Path) -> list[Path]:
    files = [folder / f for f in WEIGHT_FILES if (folder / f).exists()]
    index = files[0]
    if index.name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(f"{index}: not a weights index ({type(e).__name__}); expected a JSON object with a "
                             "weight_map") from e
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ModelError(f"{index}: names {missing[0]}, which is not in {folder}; expected every shard it names")
        return [folder / s for s in shards]
    return [index]


def _shapes(paths: Sequence[Path]) -> dict[str, tuple[int, ...]]:
    """Every stored tensor's shape, its values left unread (safetensors' header; a torch file
    mapped, not read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in paths:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                shapes.update((key, tuple(f.get_slice(key).get_shape())) for key in f.keys())
        else:
            shapes.update((key, tuple(v.shape)) for key, v in _torch_part(path).items())
    return shapes


def _torch_part(path: Path, mmap: bool | None = None) -> Mapping[str, Any]:
    """A pytorch_model.bin (or shard): read with no code from the file run (seq2seq_eval/pickles.py),
    its tensors mapped where `mmap` is None (torch's zip format); a mapping of tensors, else refused
    in one line."""
    import torch

    from ...pickles import read

    part = read(path, "MetricX checkpoints hold", mmap=mmap)
    if not isinstance(part, dict):
        raise ModelError(f"{path}: holds a {type(part).__name__}; expected a state dict (names to tensors)")
    odd = next((k for k, v in part.items() if not isinstance(v, torch.Tensor)), None)
    if odd is not None:
        raise ModelError(f"{path}: {odd!r} is a {type(part[odd]).__name__}; expected a state dict (names to tensors)")
    return part


def _layout_problem(network: Any, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """What keeps the stored tensors from being MT5ForRegression's of config.json's sizes: the
    names missing or unexpected, or the first shape that differs; None when they fit."""
    expected = {k: tuple(v.shape) for k, v in network.state_dict().items() if not k.endswith("embed_tokens.weight")}
    # The output layer (read: its row 250089) and the embedding's copies under the stacks' names.
    expected["lm_head.weight"] = expected["shared.weight"]
    optional = {"lm_head.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    missing = [k for k in expected if k not in shapes and k not in optional]
    unexpected = [k for k in shapes if k not in expected and k not in optional]
    if missing or unexpected:
        return f"missing {missing[:3]}{' ...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
    # In the model's order (the files' is alphabetical: the decoder before the encoder).
    for key in [*expected, *(k for k in shapes if k not in expected)]:
        want = expected.get(key, expected["shared.weight"])
        if key in shapes and shapes[key] != want:
            return f"{key} has shape {list(shapes[key])} where config.json's sizes give {list(want)}"
    return None


def _weights(folder: Path, tied: bool) -> tuple[dict[str, Any], Any]:
    """(every weight but lm_head, lm_head's row 250089: the only one read); a tied checkpoint's
    row is the embedding's."""
    paths = _weight_paths(folder)
    state: dict[str, Any] = {}
    row = None
    for path in paths:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    if key == "lm_head.weight":
                        row = f.get_slice(key)[SCORE_ID:SCORE_ID + 1]
                    else:
                        state[key] = f.get_tensor(key)
        else:
            part = dict(_torch_part(path, mmap=False))  # read whole: the network keeps them
            if "lm_head.weight" in part:
                row = part.pop("lm_head.weight")[SCORE_ID:SCORE_ID + 1].clone()
            state.update(part)
    if row is None or tied:
        row = state["shared.weight"][SCORE_ID:SCORE_ID + 1]
    return state, row


def check(options: Mapping[str, Any]) -> None:
    """Before any work: the options agree, the checkpoint's config.json and weights are there."""
    if options["metricx_version"] not in MAX_LENGTH:
        raise ConfigError(f"--metricx_version {options['metricx_version']!r}: expected 24 or 23 (as text: '24', '23')")
    # A hub name is fetched whole here, as load() would fetch it (config.json alone would leave
    # the weights' files missing on a first use).
    folder = _folder(options["metricx_model"], "metricx_model", CHECKPOINT_FILES)
    raw = _config(folder, options["metricx_model"])
    # The weights' names and shapes, read from the files' headers: nothing of a 14 GB checkpoint
    # is loaded here.
    _check_layout(options["metricx_model"], _network(raw), _shapes(_weight_paths(folder)))
    tokenizer = _folder(options["metricx_tokenizer"], "metricx_tokenizer", TOKENIZER_FILES)
    if not any((tokenizer / f).exists() for f in TOKENIZER_FILES):
        raise ModelError(f"--metricx_tokenizer {options['metricx_tokenizer']}: no tokenizer in {tokenizer}; expected "
                         f"one of {', '.join(TOKENIZER_FILES)} (mT5's, as google/mt5-xl)")
    # What load() reads of it, and that it fits the model, so that it fails here, not after generation.
    _check_tokenizer(options, raw, _tokenizer(options))


def _check_tokenizer(options: Mapping[str, Any], raw: Mapping[str, Any], tokenizer: Any) -> None:
    """mT5's tokenizer, as the model was trained on: every id it gives within config.json's
    vocab_size, its pad and end ids config.json's (MT5Config's defaults 0 and 1 where it is silent),
    and a text framed by the end token alone (predict.py removes the last token as that)."""
    from ..fit import first_problem, framing_problem, ids_past_embeddings, special_ids_disagree

    config = f"--metricx_model {options['metricx_model']}'s config.json"
    eos = raw.get("eos_token_id", 1)
    problem = first_problem(
        ids_past_embeddings(tokenizer, int(raw["vocab_size"])),
        special_ids_disagree(tokenizer, {"pad": raw.get("pad_token_id", 0), "eos": eos}, config),
        framing_problem(tokenizer, [], [eos], f"the text's ids then the end token {eos}"))
    if problem is not None:
        raise ModelError(f"--metricx_tokenizer {options['metricx_tokenizer']}: {problem}; expected the model's own "
                         "tokenizer (mT5's, google/mt5-xl)")


def _check_layout(name: str, network: Any, shapes: Mapping[str, tuple[int, ...]]) -> None:
    problem = _layout_problem(network, shapes)
    if problem is not None:
        raise ModelError(f"--metricx_model {name}: the weights do not match MT5ForRegression of its config.json's "
                         f"sizes ({problem})")


def _tokenizer(options: Mapping[str, Any]) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(options["metricx_tokenizer"])
    except Exception as e:  # a malformed tokenizer file raises whatever its parser meets (KeyError, ...)
        # transformers 5 turns a spiece.model alone into its tokenizer only with protobuf; without
        # it, it falls back to a tiktoken reader whose error names the wrong cause.
        try:
            import google.protobuf  # noqa: F401

            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        except ImportError:
            why = "transformers 5 reads a spiece.model alone only with protobuf installed"
        raise ModelError(f"--metricx_tokenizer {options['metricx_tokenizer']}: not loaded ({why}); expected mT5's "
                         "tokenizer (google/mt5-xl) or a folder with its tokenizer.json") from e


def load(options: Mapping[str, Any], device: Any = "cpu") -> MetricX:
    import torch

    name = options["metricx_model"]
    folder = _folder(name, "metricx_model", CHECKPOINT_FILES)
    raw = _config(folder, name)
    tokenizer = _tokenizer(options)
    _check_tokenizer(options, raw, tokenizer)  # before the weights are read (`score` runs no check first)
    tied = bool(raw.get("tie_word_embeddings", True))
    # As from_pretrained(torch_dtype="auto"): the dtype the checkpoint says, float32 when silent.
    dtype = getattr(torch, str(raw.get("torch_dtype") or raw.get("dtype") or "float32"))
    # Built without values (no random init of a 250k-row embedding), then given the checkpoint's.
    network = _network(raw)
    _check_layout(name, network, _shapes(_weight_paths(folder)))
    config = network.config
    state, row = _weights(folder, tied)
    state = {k: v.to(dtype) for k, v in state.items()}
    missing, unexpected = network.load_state_dict(state, strict=False, assign=True)
    network.encoder.embed_tokens = network.decoder.embed_tokens = network.shared
    missing = [k for k in missing if not k.endswith("embed_tokens.weight")]  # the shared embedding
    if missing or unexpected:
        raise ModelError(f"--metricx_model {name}: the weights do not match MT5ForRegression (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    network.eval().to(device)
    scale = config.d_model ** -0.5 if tied else 1.0
    return MetricX(options, network, row.to(device=device, dtype=dtype), scale, tokenizer,
                   int(raw.get("pad_token_id") or 0), torch.device(device))


METRIC = ModelMetricSpec(
    name="metricx",
    what="MetricX-24 or -23 (--metricx_model), an error score on [0, 25], lower is better; the mean over references",
    load=load,
    check=check,
    options=(
        Option("metricx_model", DEFAULT_MODEL, "with --metrics metricx: a MetricX checkpoint (MT5ForRegression), a "
               "hub name or a folder"),
        Option("metricx_tokenizer", DEFAULT_TOKENIZER, "with --metrics metricx: mT5's tokenizer, a hub name or a folder "
               "(the checkpoints ship none)"),
        Option("metricx_version", "24", "with --metrics metricx: the input format, 24 or 23",
               valid=lambda v: v in MAX_LENGTH, expected="24 or 23 (as text: '24', '23')"),
        Option("metricx_qe", False, "with --metrics metricx: quality estimation, no reference (a QE checkpoint for 23)",
               kind=bool),
        Option("metricx_max_length", None, "with --metrics metricx: input tokens kept (default: 1536 for 24, 1024 for "
               "23)", kind=int, valid=lambda v: v >= 2, expected="an integer >= 2"),
    ),
    # 24 reads the source always, 23 only without a reference; QE reads no reference.
    needs_sources=lambda o: o["metricx_version"] == "24" or bool(o["metricx_qe"]),
    needs_references=lambda o: not o["metricx_qe"],
    higher_is_better=False,
    decimals=4,
    scale=25.0,
)
