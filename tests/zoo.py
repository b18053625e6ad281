"""Builds tiny, randomly initialised copies of published seq2seq checkpoints, and runs them.

`build(spec, out_dir, corpus)` takes a `Published` checkpoint description (the values, with
their sources, live in test_zoo.py) and saves a model that keeps, as published: the
architecture class, config.json's non-size settings (task_specific_params, prefix, special-token
ids, position limits, activations), generation_config.json, and the tokenizer class with its
special tokens at the published ids. Only sizes shrink: d_model 16, one layer each side, two
heads, feed-forward 32, and the vocabulary to what the tiny tokenizer needs (Marian keeps its
58,101 entries, since its published pad id is 58,100).

Sentencepiece-based tokenizers use the real `test_sentencepiece.model` from
../shared/realdata (callers skip when it is absent); byte-level BPE (BART) and NLLB's BPE are
trained here on the test corpus.

Run as a script, this file is the zoo's rank driver: `python tests/zoo.py SPEC.json` runs
`seq2seq_eval.cli.main` once per entry of SPEC.json (a list of {"argv": [...], "port": N}) in
this one process, so 1-rank and 2-rank runs of all the models cost one process start each.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPM = Path(__file__).resolve().parents[2] / "shared" / "realdata" / "transformers" / "tests" / "fixtures" / "test_sentencepiece.model"

TINY_T5 = dict(d_model=16, d_kv=8, d_ff=32, num_heads=2, num_layers=1, num_decoder_layers=1)
TINY_BART_LIKE = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                      decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_hidden_layers=1)


@dataclass(frozen=True)
class Published:
    """What a hub checkpoint publishes, as far as evaluation is concerned."""

    hub_id: str
    architecture: str
    """transformers class named in config.json's "architectures"."""
    config: dict[str, Any]
    """config.json (label maps, paths and versions left out)."""
    generation_config: dict[str, Any] | None
    """generation_config.json; None where it could not be sourced: then transformers' own
    derivation from config.json (GenerationConfig.from_model_config) stands in for it."""
    tokenizer: str
    """Which tiny tokenizer to build: t5, bart, pegasus, marian, mbart50, nllb, m2m100."""
    tokenizer_class: str
    """The tokenizer class transformers loads for the published checkpoint."""
    tokenizer_kwargs: dict[str, Any] = field(default_factory=dict)
    """Published tokenizer_config.json settings kept (model_max_length, languages)."""

    def generation_dict(self) -> dict[str, Any]:
        from transformers import GenerationConfig

        if self.generation_config is not None:
            return dict(self.generation_config)
        return GenerationConfig.from_model_config(dict(self.config)).to_diff_dict()


# ---------------------------------------------------------------- tokenizers


def _sp_pieces() -> list[tuple[str, float]]:
    """The real sentencepiece model's ordinary pieces (its <unk>, <s>, </s> left out)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(SPM))
    return [(sp.id_to_piece(i), float(sp.get_score(i))) for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i))]


def _t5(spec: Published, corpus: list[str], work: Path) -> Any:
    from transformers import T5Tokenizer

    # T5's layout: <pad>=0, </s>=1, <unk>=2, pieces, then the 100 <extra_id_*> sentinels.
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *_sp_pieces()]
    return T5Tokenizer(vocab=vocab, **spec.tokenizer_kwargs)


def _pegasus(spec: Published, corpus: list[str], work: Path) -> Any:
    from transformers import PegasusTokenizer

    # Pegasus' layout: <pad>=0, </s>=1, <mask_1>=2, <mask_2>=3, <unk_2>..<unk_102>, <unk>=105, pieces.
    specials = ["<pad>", "</s>", "<mask_1>", "<mask_2>", *(f"<unk_{i}>" for i in range(2, 103)), "<unk>"]
    return PegasusTokenizer(vocab=[(t, 0.0) for t in specials] + _sp_pieces(), **spec.tokenizer_kwargs)


def _bart(spec: Published, corpus: list[str], work: Path) -> Any:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import BartTokenizer

    bpe = ByteLevelBPETokenizer()
    # BART's (RoBERTa's) layout: <s>=0, <pad>=1, </s>=2, <unk>=3, byte-level BPE, <mask> last.
    bpe.train_from_iterator(corpus, vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], show_progress=False)
    model = json.loads(bpe._tokenizer.to_str())["model"]
    vocab = dict(model["vocab"])
    vocab["<mask>"] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return BartTokenizer(vocab=vocab, merges=merges, **spec.tokenizer_kwargs)


def _marian(spec: Published, corpus: list[str], work: Path) -> Any:
    from transformers import MarianTokenizer

    # opus-mt's vocab.json: </s>=0, <unk>=1, the pieces, and <pad> at the last id (vocab_size - 1).
    # Its vocabulary covers every id below <pad>, and MarianTokenizer cannot decode an id it lacks;
    # the ids past the real sentencepiece model's pieces get placeholder tokens.
    work.mkdir(parents=True, exist_ok=True)
    vocab = {"</s>": 0, "<unk>": 1}
    for piece, _ in _sp_pieces():
        vocab.setdefault(piece, len(vocab))
    pad = spec.config["pad_token_id"]
    vocab.update({f"<unused_{i}>": i for i in range(len(vocab), pad)})
    vocab["<pad>"] = pad
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return MarianTokenizer(source_spm=str(SPM), target_spm=str(SPM), vocab=str(work / "vocab.json"),
                           **spec.tokenizer_kwargs)


def _mbart50(spec: Published, corpus: list[str], work: Path) -> Any:
    import sentencepiece as spm
    from transformers import MBart50Tokenizer

    sp = spm.SentencePieceProcessor(model_file=str(SPM))
    # In sentencepiece order; MBart50Tokenizer lays it out as fairseq does (<s>, <pad>, </s>,
    # <unk>, pieces, language codes, <mask>), as the real conversion did.
    pieces = [(sp.id_to_piece(i), float(sp.get_score(i))) for i in range(sp.get_piece_size())]
    return MBart50Tokenizer(vocab=pieces, **spec.tokenizer_kwargs)


def _nllb(spec: Published, corpus: list[str], work: Path) -> Any:
    from tiny_multilingual import _nllb_tokenizer

    tokenizer = _nllb_tokenizer(corpus)
    for key, value in spec.tokenizer_kwargs.items():
        setattr(tokenizer, key, value)
    return tokenizer


def _m2m100(spec: Published, corpus: list[str], work: Path) -> Any:
    from transformers import M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    work.mkdir(parents=True, exist_ok=True)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece, _ in _sp_pieces():
        vocab.setdefault(piece, len(vocab))
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lang_tokens = [f"__{c}__" for c in FAIRSEQ_LANGUAGE_CODES["m2m100"]]
    return M2M100Tokenizer(vocab_file=str(work / "vocab.json"), spm_file=str(SPM),
                           additional_special_tokens=lang_tokens, **spec.tokenizer_kwargs)


TOKENIZERS = {"t5": _t5, "pegasus": _pegasus, "bart": _bart, "marian": _marian, "mbart50": _mbart50,
              "nllb": _nllb, "m2m100": _m2m100}


# ---------------------------------------------------------------- models


def build(spec: Published, out_dir: Path, corpus: list[str], seed: int = 0) -> Path:
    """A tiny random model of `spec`, saved with its tokenizer and generation config to out_dir."""
    import torch
    import transformers
    from transformers import AutoConfig, GenerationConfig

    tokenizer = TOKENIZERS[spec.tokenizer](spec, corpus, out_dir.parent / f"{out_dir.name}_tokenizer_src")
    config = dict(spec.config)
    model_type = config.pop("model_type")
    config.update(TINY_T5 if model_type == "t5" else TINY_BART_LIKE)
    ids = [v for k, v in spec.config.items() if k.endswith("token_id") and isinstance(v, int)]
    ids += [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens]
    vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1, max(ids) + 1)
    config["vocab_size"] = vocab_size
    if "decoder_vocab_size" in config:
        config["decoder_vocab_size"] = vocab_size
    torch.manual_seed(seed)
    model = getattr(transformers, spec.architecture)(AutoConfig.for_model(model_type, **config)).eval()
    # At the usual init scale a model this small writes the same text for every input; weights
    # drawn wider make each example's generation its own, so a merge that mixed up examples
    # would show. (Drawn after construction: config.json keeps the published init settings.)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    model.generation_config = GenerationConfig.from_dict(spec.generation_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# ---------------------------------------------------------------- rank driver


def _drive(spec_path: str) -> int:
    """Run seq2seq_eval once per entry, each with its own rendezvous port (rank 0 opens a new
    store per run, and a port just closed may not be reusable at once)."""
    import logging

    from seq2seq_eval.cli import main

    worst = 0
    for entry in json.loads(Path(spec_path).read_text()):
        os.environ["MASTER_PORT"] = str(entry["port"])
        # main() configures the package logger on each call; start each run from a clean one.
        logging.getLogger("seq2seq_eval").handlers.clear()
        rc = main(entry["argv"])
        print(f"zoo-driver: {entry['name']} exit {rc}", file=sys.stderr, flush=True)
        worst = max(worst, rc)
    return worst


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(_drive(sys.argv[1]))
