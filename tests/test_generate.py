"""Beam search with seq2seq_eval's cache (no cross-attention reorder, a spare slot for the next
position) gives exactly the outputs of generate()'s own cache, on every encoder-decoder family we
name, and is really used."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from seq2seq_eval.config import EMBEDDED_MODEL, EvalConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COMMON_BART = dict(
    vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
    pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
)


def _tiny(family: str):
    """A tiny random model of `family`: random weights give long, beam-shuffling searches."""
    torch.manual_seed(0)
    if family == "t5":
        cfg = transformers.T5Config(vocab_size=97, d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
                                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
        return transformers.T5ForConditionalGeneration(cfg).eval()
    if family == "bart":
        return transformers.BartForConditionalGeneration(transformers.BartConfig(**COMMON_BART)).eval()
    if family == "mbart":
        return transformers.MBartForConditionalGeneration(transformers.MBartConfig(**COMMON_BART)).eval()
    if family == "marian":
        cfg = transformers.MarianConfig(**{**COMMON_BART, "pad_token_id": 96, "decoder_start_token_id": 96})
        return transformers.MarianMTModel(cfg).eval()
    if family == "pegasus":
        cfg = transformers.PegasusConfig(**{**COMMON_BART, "pad_token_id": 0, "eos_token_id": 1,
                                            "decoder_start_token_id": 0})
        return transformers.PegasusForConditionalGeneration(cfg).eval()
    if family == "m2m100":
        return transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**COMMON_BART)).eval()
    raise ValueError(family)


def _batch(model, n: int = 5, seed: int = 1):
    """Rows of different lengths, right-padded, none containing pad or EOS."""
    g = torch.Generator().manual_seed(seed)
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    width = 14
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for row in range(n):
        length = 3 + row * 2
        body = torch.randint(3, 90, (length - 1,), generator=g)
        ids[row, : length - 1], ids[row, length - 1] = body, eos
        mask[row, :length] = 1
    return ids, mask


def _gc(model, **kw):
    gc = transformers.GenerationConfig.from_model_config(model.config)
    gc.update(num_beams=4, max_length=20, return_dict_in_generate=True, output_scores=True, **kw)
    return gc


def _generate(model, gc, cache, seed: int = 0):
    from seq2seq_eval.engines.beam_cache import beam_cache, cache_kwarg

    ids, mask = _batch(model)
    torch.manual_seed(seed)
    extra = {cache_kwarg(model): beam_cache(model, gc)} if cache else {}
    if cache:
        assert extra[cache_kwarg(model)] is not None
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, **extra)


@pytest.fixture
def spare_slot_appends(monkeypatch):
    """Counts the appends that filled the spare slot rather than concatenating."""
    from seq2seq_eval.engines import beam_cache

    layer_class = beam_cache._classes()[0]
    calls = {"spare": 0, "concatenated": 0}
    fits = layer_class._fits

    def counting(self, *args):
        ok = fits(self, *args)
        calls["spare" if ok else "concatenated"] += 1
        return ok

    monkeypatch.setattr(layer_class, "_fits", counting)
    return calls


@pytest.mark.parametrize("family", ["t5", "bart", "mbart", "marian", "pegasus", "m2m100"])
@pytest.mark.parametrize("options", [
    {},
    {"num_return_sequences": 3},
    {"do_sample": True, "top_k": 20},
    {"length_penalty": 0.6, "no_repeat_ngram_size": 2, "early_stopping": True, "min_length": 8},
])
def test_beam_cache_gives_identical_beam_search(family, options, spare_slot_appends):
    model = _tiny(family)
    gc = _gc(model, **options)
    ours, theirs = _generate(model, gc, cache=True), _generate(model, gc, cache=False)
    assert spare_slot_appends["spare"] > 0 and spare_slot_appends["concatenated"] == 0
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(ours.sequences_scores, theirs.sequences_scores)
    # The search did move beams around: a cache that failed to follow would have shown it.
    steps = theirs.beam_indices[:, 1:-1]
    assert ((steps >= 0) & (steps != steps[:, :1])).any()


@pytest.mark.parametrize("fault", ["no reorder", "stale slot"])
def test_a_cache_that_loses_track_of_beams_would_be_caught(fault, monkeypatch):
    """The comparison above is sensitive: a cache that does not follow the beams, or that
    appends to the buffer from before the reorder, changes the outputs."""
    from seq2seq_eval.engines import beam_cache

    model = _tiny("t5")
    gc = _gc(model)
    theirs = _generate(model, gc, cache=False)
    if fault == "no reorder":
        monkeypatch.setattr(beam_cache._classes()[1], "reorder_cache", lambda self, beam_idx: None)
    else:
        layer_class = beam_cache._classes()[0]
        reorder = layer_class.reorder_cache

        def reorder_then_forget(self, beam_idx):
            before = (self.keys, self.values)
            reorder(self, beam_idx)
            if before[0] is not None and before[0].shape[-2] > 0:
                n = before[0].shape[-2]
                stale = [torch.cat([t, t[..., -1:, :]], dim=-2) for t in before]
                self._spare = (stale[0], stale[1])
                self.keys, self.values = stale[0][..., :n, :], stale[1][..., :n, :]

        monkeypatch.setattr(layer_class, "reorder_cache", reorder_then_forget)
    broken = _generate(model, gc, cache=True)
    assert not torch.equal(broken.sequences, theirs.sequences)


def test_the_spare_slot_is_skipped_when_the_cache_changed_since_the_reorder(spare_slot_appends):
    """A crop between reorder and append (not something beam search does) concatenates."""
    from seq2seq_eval.engines import beam_cache

    layer = beam_cache._classes()[0]()
    states = torch.arange(2 * 3 * 4 * 5, dtype=torch.float).reshape(2, 3, 4, 5)
    layer.update(states, states + 1)
    layer.reorder_cache(torch.tensor([1, 0]))
    layer.crop(-1)
    new = torch.full((2, 3, 1, 5), -1.0)
    keys, _ = layer.update(new, new)
    assert spare_slot_appends == {"spare": 0, "concatenated": 1}
    assert torch.equal(keys, torch.cat([states[[1, 0], :, :3], new], dim=-2))
    layer.reorder_cache(torch.tensor([1, 1]))
    before = keys
    keys, values = layer.update(new, new)
    assert spare_slot_appends == {"spare": 1, "concatenated": 1}
    expected = torch.cat([before[[1, 1]], new], dim=-2)
    assert torch.equal(keys, expected) and keys.is_contiguous() and values.is_contiguous()


@pytest.mark.parametrize("setting, value", [("num_beams", 1), ("use_cache", False), ("cache_implementation", "static")])
def test_generate_keeps_its_own_cache_where_the_shortcut_does_not_apply(setting, value):
    from seq2seq_eval.engines.beam_cache import beam_cache

    model = _tiny("bart")
    assert beam_cache(model, _gc(model)) is not None
    gc = _gc(model)
    setattr(gc, setting, value)
    assert beam_cache(model, gc) is None


def test_generator_uses_the_beam_cache_on_the_embedded_model(monkeypatch, spare_slot_appends):
    """HFEngine hands the cache to generate() (its reorder runs, and no deprecation warning) and the
    outputs are unchanged."""
    from seq2seq_eval.model import settings as model_settings
    from seq2seq_eval.inputs.files import read_lines
    from seq2seq_eval.engines import beam_cache, hf
    from seq2seq_eval.engines.hf import HFEngine

    cfg = EvalConfig(model_name=str(EMBEDDED_MODEL), generate_kwargs=(("num_beams", 4),))
    tokenizer = model_settings.load_tokenizer(cfg)
    model_config, base = model_settings.load_model_config(cfg)
    gc = model_settings.generation_config_for(model_config, base, tokenizer, cfg)
    gc.num_return_sequences = 2
    model = model_settings.load_model(cfg, torch.device("cpu"))
    sources = read_lines(Path(cfg.data_dir) / "test.source")[:8]
    ids, _ = model_settings.encode_sources(tokenizer, sources, "", 128)

    calls = []
    cls = beam_cache._classes()[1]
    original = cls.reorder_cache
    monkeypatch.setattr(cls, "reorder_cache", lambda self, beam_idx: calls.append(1) or original(self, beam_idx))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = HFEngine(model, tokenizer, gc, torch.device("cpu")).generate(ids, 0)
    assert calls and spare_slot_appends["spare"] > 0
    # Handed over under the name this transformers reads, so no deprecation warning per batch.
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
    monkeypatch.setattr(hf, "beam_cache", lambda model, gc: None)
    theirs = HFEngine(model, tokenizer, gc, torch.device("cpu")).generate(ids, 0)
    assert ours == theirs


def test_a_backend_that_cannot_select_into_a_view_reorders_as_usual(monkeypatch, spare_slot_appends):
    """Should index_select(out=<strided view>) be refused (a backend we could not test on), the
    layer reorders like DynamicLayer and appends by concatenation: same outputs, no spare slot."""
    model = _tiny("t5")
    gc = _gc(model)
    theirs = _generate(model, gc, cache=False)
    select = torch.index_select

    def refuse_out(*args, **kwargs):
        if "out" in kwargs:
            raise RuntimeError("index_select(): out must be contiguous")
        return select(*args, **kwargs)

    monkeypatch.setattr(torch, "index_select", refuse_out)
    ours = _generate(model, gc, cache=True)
    assert spare_slot_appends["spare"] == 0
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(ours.sequences_scores, theirs.sequences_scores)


def test_generation_on_cuda_keeps_off_cudnn_attention_and_cpu_is_left_alone():
    """cuDNN's attention builds a plan per input shape, and beam search brings new shapes at every
    step: the engine's generate() runs with every other backend on CUDA (docs/gpu.md, "Half
    precision"), and with the default choice elsewhere. The flags come back as they were."""
    from seq2seq_eval.engines.hf import attention_backends

    pytest.importorskip("torch.nn.attention")
    backends = torch.backends.cuda
    before = (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(),
              backends.math_sdp_enabled())
    with attention_backends(torch.device("cuda")):
        assert not backends.cudnn_sdp_enabled()
        assert backends.flash_sdp_enabled() and backends.mem_efficient_sdp_enabled() and backends.math_sdp_enabled()
    assert (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(),
            backends.math_sdp_enabled()) == before
    with attention_backends(torch.device("cpu")):
        assert backends.cudnn_sdp_enabled() == before[0]
