"""model/fingerprint.py: what a rank holds in memory, compared by content."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from seq2seq_eval.model.fingerprint import tensor_crc, tokenizer_digest, tokenizer_fingerprint, weights_fingerprint

EMBEDDED = Path(__file__).resolve().parents[1] / "data_samples" / "model"


@pytest.fixture(scope="module")
def marian():
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(EMBEDDED).eval(), AutoTokenizer.from_pretrained(EMBEDDED)


def test_equal_copies_have_equal_fingerprints(marian):
    model, _ = marian
    assert weights_fingerprint(model) == weights_fingerprint(copy.deepcopy(model))


@pytest.mark.parametrize("change", ["one element by one ulp", "two rows swapped", "a buffer", "a dtype"])
def test_any_change_of_the_weights_changes_the_fingerprint(marian, change):
    model, _ = marian
    other = copy.deepcopy(model)
    with torch.no_grad():
        if change == "one element by one ulp":
            p = next(other.parameters()).view(-1)
            p[7] = torch.nextafter(p[7], torch.tensor(float("inf")))
        elif change == "two rows swapped":
            w = other.get_input_embeddings().weight
            w[[3, 4]] = w[[4, 3]].clone()
        elif change == "a buffer":
            name, buf = next((n, b) for n, b in other.named_buffers() if b.numel())
            buf.view(-1)[0] += 1
        else:
            other = other.to(torch.bfloat16)
    assert weights_fingerprint(other) != weights_fingerprint(model)


def test_the_crc_reads_the_bits_of_every_dtype():
    x = torch.arange(10, dtype=torch.float32)
    assert tensor_crc(x) == tensor_crc(x.clone()) != tensor_crc(x.flip(0))
    for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        assert isinstance(tensor_crc(x.to(dtype)), int)
    # The bits, not the values: -0.0 and 0.0 are equal numbers with other bits.
    assert tensor_crc(torch.tensor([0.0])) != tensor_crc(torch.tensor([-0.0]))


def test_a_tensor_without_data_enters_by_name_and_shape():
    meta = torch.nn.Linear(4, 3, device="meta")
    assert weights_fingerprint(meta) == weights_fingerprint(torch.nn.Linear(4, 3, device="meta"))
    assert weights_fingerprint(meta) != weights_fingerprint(torch.nn.Linear(4, 2, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_the_fingerprint_is_the_same_on_the_gpu(marian):
    model, _ = marian
    assert weights_fingerprint(copy.deepcopy(model).cuda()) == weights_fingerprint(model)


def _swapped_ids(tmp_path: Path) -> Path:
    """The embedded tokenizer with two ordinary tokens' ids swapped in tokenizer.json."""
    out = tmp_path / "swapped"
    out.mkdir()
    for f in EMBEDDED.glob("tokenizer*"):
        (out / f.name).write_bytes(f.read_bytes())
    data = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    if isinstance(vocab, dict):
        a, b = list(vocab)[10:12]
        vocab[a], vocab[b] = vocab[b], vocab[a]
    else:  # unigram: a list of [piece, score]; swap two entries' places
        vocab[10], vocab[11] = vocab[11], vocab[10]
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return out


def test_the_tokenizer_fingerprint_sees_swapped_ids_and_each_setting(marian, tmp_path):
    from transformers import AutoTokenizer

    _, tok = marian
    base = tokenizer_fingerprint(tok)
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(EMBEDDED)) == base
    assert json.loads(json.dumps(base)) == base  # compared after a round trip through JSON
    swapped = tokenizer_fingerprint(AutoTokenizer.from_pretrained(_swapped_ids(tmp_path)))
    assert swapped["vocab_sha256"] != base["vocab_sha256"] and swapped["pipeline_sha256"] != base["pipeline_sha256"]
    for attr, value in (("model_max_length", 4), ("padding_side", "left"), ("truncation_side", "left")):
        other = copy.deepcopy(tok)
        setattr(other, attr, value)
        changed = tokenizer_fingerprint(other)
        assert [k for k in base if base[k] != changed[k]] == [attr]
        assert tokenizer_digest(other) != tokenizer_digest(tok)


def test_a_sentencepiece_tokenizer_is_fingerprinted_by_its_models(tmp_path):
    from zoo import SPM

    if not SPM.exists():
        pytest.skip("../shared/realdata is absent")
    from transformers import MarianTokenizer

    vocab = {"</s>": 0, "<unk>": 1, "▁a": 2, "<pad>": 3}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tok = MarianTokenizer(source_spm=str(SPM), target_spm=str(SPM), vocab=str(tmp_path / "vocab.json"))
    fp = tokenizer_fingerprint(tok)
    assert fp["pipeline_sha256"] is not None
    assert tokenizer_fingerprint(copy.deepcopy(tok)) == fp
