"""Tiny random multilingual models with real tokenizer classes, built offline for tests.

Three language-code conventions, each with its own tokenizer class and a tiny random model:
  - mBART-50 (MBart50Tokenizer + MBartForConditionalGeneration): source "ro_RO x </s>", codes like en_XX;
  - NLLB (NllbTokenizer + M2M100ForConditionalGeneration): source "ron_Latn x </s>", codes like eng_Latn;
    with legacy_behaviour=True ("nllb_legacy") the code comes last instead: "x </s> ron_Latn";
  - M2M100 (M2M100Tokenizer + M2M100ForConditionalGeneration): source "__ro__ x </s>", codes like en.
For each, generation must start with decoder_start_token_id then the target language token.
The subword vocabularies are trained here (sentencepiece / tokenizers), so no file is downloaded.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

CONVENTIONS = ("mbart50", "nllb", "nllb_legacy", "m2m100")

# Language codes each convention uses for English and Romanian.
LANG_CODES = {
    "mbart50": ("en_XX", "ro_RO"),
    "nllb": ("eng_Latn", "ron_Latn"),
    "nllb_legacy": ("eng_Latn", "ron_Latn"),
    "m2m100": ("en", "ro"),
}


def _sentencepiece_unigram(corpus: list[str], vocab_size: int = 120) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=buf, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False,
        minloglevel=2, num_threads=1,
    )
    return buf.getvalue()


def _mbart50_tokenizer(corpus: list[str]):
    import sentencepiece as spm
    from transformers import MBart50Tokenizer

    sp = spm.SentencePieceProcessor(model_proto=_sentencepiece_unigram(corpus))
    # sentencepiece order (<unk>, <s>, </s>, pieces...): MBart50Tokenizer reorders it to fairseq's
    # (<s>, <pad>, </s>, <unk>, pieces..., language codes, <mask>) as the real conversion does.
    pieces = [(sp.id_to_piece(i), float(sp.get_score(i))) for i in range(sp.get_piece_size())]
    return MBart50Tokenizer(vocab=pieces)


def _nllb_tokenizer(corpus: list[str], legacy: bool = False):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import NllbTokenizer

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=150, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], show_progress=False))
    model = json.loads(bpe.to_str())["model"]
    return NllbTokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]], legacy_behaviour=legacy)


def _m2m100_tokenizer(corpus: list[str], work: Path):
    import sentencepiece as spm
    from transformers import M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    proto = _sentencepiece_unigram(corpus)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    work.mkdir(parents=True, exist_ok=True)
    (work / "sentencepiece.bpe.model").write_bytes(proto)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    # Real M2M100 checkpoints list the __xx__ language tokens as additional special tokens (so
    # decoding with skip_special_tokens drops them); the constructor alone does not.
    lang_tokens = [f"__{c}__" for c in FAIRSEQ_LANGUAGE_CODES["m2m100"]]
    return M2M100Tokenizer(vocab_file=str(work / "vocab.json"), spm_file=str(work / "sentencepiece.bpe.model"),
                           additional_special_tokens=lang_tokens)


def build_tiny_multilingual(convention: str, out_dir: Path, corpus: list[str], seed: int = 0) -> Path:
    """A tiny random model of `convention` (one of CONVENTIONS) with its tokenizer, saved to out_dir."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration, MBartConfig, MBartForConditionalGeneration

    if convention == "mbart50":
        tokenizer = _mbart50_tokenizer(corpus)
    elif convention in ("nllb", "nllb_legacy"):
        tokenizer = _nllb_tokenizer(corpus, legacy=convention == "nllb_legacy")
    elif convention == "m2m100":
        tokenizer = _m2m100_tokenizer(corpus, out_dir.parent / f"{out_dir.name}_spm")
    else:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    # Language ids of M2M100 sit past len(tokenizer); size the embeddings for every id in use.
    vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1, *(
        tokenizer.convert_tokens_to_ids(t) + 1 for t in tokenizer.all_special_tokens))
    common = dict(
        vocab_size=vocab_size, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    )
    torch.manual_seed(seed)
    if convention == "mbart50":
        model = MBartForConditionalGeneration(MBartConfig(**common)).eval()
    else:
        model = M2M100ForConditionalGeneration(M2M100Config(**common)).eval()
    model.generation_config.num_beams = 2
    model.generation_config.max_length = 10
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
