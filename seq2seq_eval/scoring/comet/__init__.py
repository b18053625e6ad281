"""COMET (Rei et al., 2020/2022; Rei et al., 2022 for CometKiwi; Guerreiro et al., 2024 for
XCOMET) natively on transformers 5, from the published checkpoints: `load(name_or_path, device)`
gives a ModelMetric whose per-example values equal unbabel-comet 2.2.7's `predict`, of the class
hparams.yaml names (regression: wmt22/wmt20-comet-da; unified: wmt22-cometkiwi-da; XCOMET).
`checkpoint` reads the published layout, `network` the regression computation, `unified` the
unified one and `spans` its error spans; METRIC is what the registry reads: what a model reads
and writes follows its class."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..model_metric import ModelMetric, ModelMetricSpec, Option
from .checkpoint import (DEFAULT_MODEL, REGRESSION, encoder_source, hparams_of, layout_problem, load_state_dict, model_folder,
                         needs_references, read_hparams, segments, tags_words)

__all__ = ["DEFAULT_MODEL", "METRIC", "Comet", "check", "load"]


class Comet(ModelMetric):
    name = "comet"

    def __init__(self, model_name: str, network: Any, tokenizer: Any, max_length: int, device: Any) -> None:
        self.model_name = model_name
        self.network = network
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.device = device

    @property
    def signature(self) -> str:
        from ... import __version__

        return f"model:{self.model_name}|refs:mean|seq2seq_eval:{__version__}"

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        # COMET's prepare_sample: the tokenizer's special tokens, truncated to max_positions - 2.
        return self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]

    def lengths(self, sources: Sequence[str], predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> list[int]:
        flat = [r for refs in references for r in refs]
        ref_lens = iter(len(x) for x in self._ids(flat))
        src = self._ids(sources)
        mt = self._ids(predictions)
        return [max(len(s), len(m), *(next(ref_lens) for _ in refs)) for s, m, refs in zip(src, mt, references)]

    def _embed_distinct(self, ids: list[list[int]], max_tokens: int) -> Any:
        """Every segment's embedding, one row each: the segments longest first, cut into forward
        passes of at most `max_tokens` padded tokens, so a pass pads little (segments of every
        role side by side, where per-role passes of an example batch pad each role to its longest)."""
        import torch

        order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))
        pad = self.tokenizer.pad_token_id
        out: Any = None
        start = 0
        while start < len(order):
            width = len(ids[order[start]])
            stop = start + max(1, min(len(order) - start, max_tokens // max(width, 1)))
            chunk = order[start:stop]
            input_ids = torch.tensor([ids[i] + [pad] * (width - len(ids[i])) for i in chunk], device=self.device)
            mask = torch.tensor([[1] * len(ids[i]) + [0] * (width - len(ids[i])) for i in chunk], device=self.device)
            emb = self.network.embed(input_ids, mask)
            if out is None:
                out = emb.new_empty((len(ids), emb.size(1)))
            out[torch.tensor(chunk, device=self.device)] = emb
            start = stop
        return out

    def score(self, sources: Sequence[str], predictions: Sequence[str],
              references: Sequence[Sequence[str]], max_tokens: int | None = None) -> list[float]:
        import torch

        from ..model_metric import default_budget

        if not sources:
            return []
        counts = [len(r) for r in references]
        if min(counts) < 1:
            raise ValueError("COMET needs at least one reference per example")
        budget = default_budget(max_tokens, self.device.type)
        flat = [r for refs in references for r in refs]
        # One encoder pass per distinct text: a translation equal to its reference, or a source
        # shared by several examples, is encoded once (the encoder sees each text alone).
        texts = list(dict.fromkeys([*sources, *predictions, *flat]))
        row = {t: i for i, t in enumerate(texts)}
        with torch.inference_mode():
            emb = self._embed_distinct(self._ids(texts), budget)

            def rows(xs: Sequence[str]) -> Any:
                return emb[torch.tensor([row[x] for x in xs], device=emb.device)]

            # Each reference is scored with its example's source and translation, then averaged.
            owner = [i for i, n in enumerate(counts) for _ in range(n)]
            scores = self.network.estimate(rows([sources[i] for i in owner]), rows([predictions[i] for i in owner]),
                                           rows(flat)).double().tolist()
        out, start = [], 0
        for n in counts:
            out.append(sum(scores[start:start + n]) / n)
            start += n
        return out


def check(name_or_path: str = DEFAULT_MODEL) -> None:
    """Everything load() reads but the weights, read and checked without loading them, before any
    work: the model's folder (or hub files) and its hparams.yaml, the encoder's config and
    tokenizer, the network hparams.yaml describes (built on the meta device); on a GPU, also that
    its weights fit the GPU's memory (XCOMET-XXL's 40 GiB of float32 weights do not fit a 40 GB one)."""
    import torch

    from ...errors import ModelError

    folder = model_folder(name_or_path)
    hparams = read_hparams(folder, name_or_path)
    config, tokenizer = _encoder(name_or_path, folder, hparams)
    try:
        with torch.device("meta"):
            network = _network(hparams, config, tokenizer.pad_token_id)
    except ValueError as e:
        raise ModelError(f"--comet_model {name_or_path}: {folder / 'hparams.yaml'}: {e}") from e
    # The checkpoint's names and shapes against the network's, its tensors mapped, not read.
    _check_layout(name_or_path, hparams, network, load_state_dict(folder))
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        refuse_oversized(name_or_path, _float32_bytes(network), torch.cuda.get_device_properties(device).total_memory,
                         f"{torch.cuda.get_device_name(device)} has in all")


def _encoder(name_or_path: str, folder: Any, hparams: dict[str, Any]) -> tuple[Any, Any]:
    """(the encoder's config, its tokenizer), from where hparams.yaml's pretrained_model says."""
    from transformers import AutoTokenizer

    from ...errors import ModelError
    from .network import encoder_class

    source = encoder_source(folder, hparams)
    try:
        # The config class COMET's encoder names (XLM-R or XLM-R-XL), whatever config.json's model_type.
        config, tokenizer = encoder_class(hparams)[0].from_pretrained(source), AutoTokenizer.from_pretrained(source)
    except Exception as e:  # a malformed file raises whatever its parser meets (KeyError, ...)
        raise ModelError(f"--comet_model {name_or_path}: the encoder's config and tokenizer ({source!r}, hparams.yaml's "
                         f"pretrained_model) were not found or not read ({type(e).__name__}); put them in a folder of "
                         "that name beside hparams.yaml (docs/metrics.md#comet)") from e
    _check_tokenizer(name_or_path, source, config, tokenizer)
    return config, tokenizer


def _check_tokenizer(name_or_path: str, source: str, config: Any, tokenizer: Any) -> None:
    """The encoder's tokenizer fits its config (and so the checkpoint, whose shapes the config's
    are): every id within the embeddings' vocab_size rows, the pad, start and end ids the config's
    (XLM-R finds padding by the config's pad id, to number positions and to pool), and a text
    framed by the start and end tokens, as COMET's encoders frame it (the first token's embedding
    is the unified models' sentence embedding)."""
    from ...errors import ModelError
    from ..fit import first_problem, framing_problem, ids_past_embeddings, special_ids_disagree

    ids = {"pad": config.pad_token_id, "bos": config.bos_token_id, "eos": config.eos_token_id}
    problem = first_problem(
        ids_past_embeddings(tokenizer, int(config.vocab_size)),
        special_ids_disagree(tokenizer, ids, "its config.json", needed=("pad",)),  # the tool pads with it
        framing_problem(tokenizer, [ids["bos"]] if ids["bos"] is not None else [],
                        [ids["eos"]] if ids["eos"] is not None else [],
                        f"the start token {ids['bos']}, the text's ids, the end token {ids['eos']} (XLM-R's)"))
    if problem is not None:
        raise ModelError(f"--comet_model {name_or_path}: the encoder's tokenizer ({source!r}, hparams.yaml's "
                         f"pretrained_model) does not fit its config.json: {problem}")


def weights_bytes(hparams: dict[str, Any], config: Any) -> int:
    """The float32 bytes of the model's parameters, counted on the meta device (nothing allocated)."""
    import torch

    with torch.device("meta"):
        return _float32_bytes(_network(hparams, config, pad_token_id=1))


def _float32_bytes(network: Any) -> int:
    return sum(p.numel() for p in network.parameters()) * 4


def refuse_oversized(name_or_path: str, needed: int, available: int, where: str) -> None:
    """A model whose float32 weights alone exceed the GPU's memory is refused in one line (its
    activations come on top); unbabel-comet would fail with CUDA's out-of-memory error."""
    from ...errors import ModelError

    if needed > available:
        raise ModelError(f"--comet_model {name_or_path}: its float32 weights take {needed / 2**30:.1f} GiB, more than "
                         f"the {available / 2**30:.1f} GiB the {where}; score it on a GPU with more memory "
                         "(docs/metrics.md#cometkiwi-and-xcomet)")


def _check_layout(name_or_path: str, hparams: dict[str, Any], network: Any, state: dict[str, Any]) -> None:
    from ...errors import ModelError

    problem = layout_problem(network, state)
    if problem is not None:
        raise ModelError(f"--comet_model {name_or_path}: the checkpoint does not match its class "
                         f"{hparams['class_identifier']} ({problem})")


def _network(hparams: dict[str, Any], config: Any, pad_token_id: int) -> Any:
    from .network import RegressionNetwork
    from .unified import UnifiedNetwork

    if hparams["class_identifier"] == REGRESSION:
        return RegressionNetwork(config, hparams, pad_token_id)
    return UnifiedNetwork(config, hparams)


def _no_init_weights() -> Any:
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4
    return no_init_weights()


def load(name_or_path: str = DEFAULT_MODEL, device: Any = "cpu") -> ModelMetric:
    """A COMET model from a folder or hub name in COMET's published layout, of the class its
    hparams.yaml names: regression (COMET-22/20), unified (CometKiwi) or XCOMET."""
    import torch

    from ...errors import ModelError
    from .unified import UnifiedComet

    folder = model_folder(name_or_path)
    hparams = read_hparams(folder, name_or_path)
    config, tokenizer = _encoder(name_or_path, folder, hparams)
    kind = hparams["class_identifier"]
    try:
        # Every parameter comes from the checkpoint (a missing one is refused below), so the random
        # initialization unbabel-comet pays (4.9 s for XLM-R-large's size on one CPU core under its
        # transformers 4.57, growing with the parameters) is skipped; the constructors still make
        # the buffers (position ids).
        with _no_init_weights():
            network = _network(hparams, config, tokenizer.pad_token_id)
    except ValueError as e:
        raise ModelError(f"--comet_model {name_or_path}: {folder / 'hparams.yaml'}: {e}") from e
    # Mapped, not read: the tensors are copied once, into the network (an XLM-R-XL checkpoint
    # read whole beside the network would take twice its 14 GB).
    state = load_state_dict(folder)
    _check_layout(name_or_path, hparams, network, state)
    # Buffers that are no parameters (checkpoint.layout_problem) are not loaded.
    network.load_state_dict({k: v for k, v in state.items()
                             if not k.endswith(("position_ids", "token_type_ids", "dropout_mask", "dropout_fill"))
                             and not k.startswith("wordloss.")}, strict=False)
    network.drop_unused_layers()
    if torch.device(device).type == "cuda":
        refuse_oversized(name_or_path, sum(p.numel() * p.element_size() for p in network.parameters()),
                         torch.cuda.mem_get_info(torch.device(device))[0], "GPU has free")
    network.eval().to(device)
    if kind == REGRESSION:
        return Comet(str(name_or_path), network, tokenizer, config.max_position_embeddings - 4, torch.device(device))
    return UnifiedComet(str(name_or_path), hparams, network, tokenizer, config.max_position_embeddings - 2,
                        torch.device(device))


SPANS = "comet_error_spans"
"""The per-example record of a model that tags words (XCOMET): predict()'s metadata.error_spans."""


class _Declared(NamedTuple):
    sources: bool
    needs_references: bool
    reads_references: bool
    max_references: int | None
    spans: bool


def _declared(name_or_path: str) -> _Declared:
    """What a model reads and writes, from its hparams.yaml. A hub name that cannot be read (offline,
    not cached) declares a regression model's, and the checks before any work say why it is not
    found; a path that cannot be read is refused here, in `check`'s one line, so that nothing is
    refused for inputs it would not read. A unified class joins one reference into its inputs:
    it reads at most one."""
    from ...errors import ModelError

    try:
        hparams = hparams_of(name_or_path)
    except ModelError:
        # A hub name is owner/name; anything else is a path.
        if Path(name_or_path).expanduser().is_absolute() or name_or_path.startswith((".", "~")) \
                or name_or_path.count("/") > 1:
            raise
        return _Declared(True, True, True, None, False)
    reads = "ref" in segments(hparams)
    return _Declared("src" in segments(hparams), needs_references(hparams), reads,
                     None if hparams["class_identifier"] == REGRESSION or not reads else 1, tags_words(hparams))


METRIC = ModelMetricSpec(
    name="comet",
    what="COMET (--comet_model): COMET-22/20 (the mean over references), CometKiwi (no reference) or XCOMET "
         "(reference optional; its error spans as comet_error_spans)",
    load=lambda options, device: load(options["comet_model"], device),
    check=lambda options: check(options["comet_model"]),
    options=(Option("comet_model", DEFAULT_MODEL, "with --metrics comet: a COMET model (regression, CometKiwi or "
                    "XCOMET), as a hub name or a folder in COMET's layout (hparams.yaml, checkpoints/model.ckpt)"),),
    # What the model reads and writes follows its class (hparams.yaml), as unbabel-comet's predict.
    needs_sources=lambda options: _declared(options["comet_model"]).sources,
    needs_references=lambda options: _declared(options["comet_model"]).needs_references,
    reads_references=lambda options: _declared(options["comet_model"]).reads_references,
    max_references=lambda options: _declared(options["comet_model"]).max_references,
    records=lambda options: (SPANS,) if _declared(options["comet_model"]).spans else (),
    decimals=4,  # COMET lives on [0, 1]-ish, the text metrics on [0, 100]
)
