"""Tiny randomly initialised decoder-only models with their tokenizers, built offline for tests.

Two tokenizer conventions, as the published families have them:

- Llama-style (`build_tiny_llama`): the tokenizer adds BOS to every text (a SentencePiece-like
  BPE with "▁" word marks), no padding token, a chat template that writes BOS itself
  (`[INST] ... [/INST]`, a `<<SYS>>` system turn);
- Qwen2-style (`build_tiny_qwen2`): byte-level BPE, no BOS at all, `<|endoftext|>` as padding,
  a ChatML template (`<|im_start|>user ... <|im_end|>`), two end tokens (`<|im_end|>`,
  `<|endoftext|>`) in the generation config, and Qwen2.5's RoPE base (1e6, not the default 1e4:
  a conversion that dropped it would change the outputs).

Random weights generate deterministic nonsense, which is what equality, world-size and resume
tests need; the embedded demo (data_samples/causal_model) is the trained one.
"""

from __future__ import annotations

from pathlib import Path

LLAMA_CHAT = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}<<SYS>> {{ m['content'] }} <</SYS>>"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
QWEN2_CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _save(model, tokenizer, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_tiny_llama(out_dir: Path, corpus: list[str], seed: int = 0, positions: int = 256) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False))
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   additional_special_tokens=specials[3:], model_max_length=positions,
                                   chat_template=LLAMA_CHAT)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=None,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.max_new_tokens = 12
    model.generation_config.max_length = None
    return _save(model, fast, out_dir)


def build_tiny_qwen2(out_dir: Path, corpus: list[str], seed: int = 0, positions: int = 256) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=specials[1:2], model_max_length=positions,
                                   chat_template=QWEN2_CHAT)
    ends = [fast.convert_tokens_to_ids("<|im_end|>"), fast.convert_tokens_to_ids("<|endoftext|>")]
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         bos_token_id=None, eos_token_id=ends[1], pad_token_id=ends[1], tie_word_embeddings=True,
                         rope_theta=1e6)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = ends
    model.generation_config.pad_token_id = ends[1]
    model.generation_config.max_new_tokens = 12
    model.generation_config.max_length = None
    return _save(model, fast, out_dir)


def byte_tokens(text: str) -> list[str]:
    """`text` as a byte-level vocabulary's one-byte tokens (one token per UTF-8 byte)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    return [table[b] for b in text.encode("utf-8")]


def build_byte_bigram(out_dir: Path, corpus: list[str], chains: list[list[str]], seed: int = 0) -> Path:
    """A Qwen2-style model (byte-level BPE tokenizer, as `build_tiny_qwen2`) whose next token depends
    on the last token only, with successors chosen by the test: a random bigram table (seeded) in
    which each token of `chains` (vocabulary tokens, in order) is followed by the next one by a
    wide margin. The hidden size is the vocabulary's; embeddings are one-hot, attention and MLP
    outputs zero, so the last hidden state is the current token's (normalised) and the head reads
    its row of the table. What greedy search generates is then known, and beam search's other
    beams take the table's random runners-up: multi-byte characters split into byte tokens, a
    stop string's bytes, the special tokens, where a test wants them."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=specials[1:2], model_max_length=128)
    ends = [fast.convert_tokens_to_ids("<|im_end|>"), fast.convert_tokens_to_ids("<|endoftext|>")]
    vocab = len(fast)
    hidden = vocab + vocab % 2
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         bos_token_id=None, eos_token_id=ends[1], pad_token_id=ends[1], tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, vocab, generator=g) * 2.0  # table[a, b]: the logit of b after a
    following: dict[int, int] = {}
    for chain in chains:
        ids = fast.convert_tokens_to_ids(chain)
        for a, b in zip(ids, ids[1:]):
            if following.setdefault(a, b) != b:
                raise ValueError(f"token {fast.convert_ids_to_tokens(a)!r} is given two successors")
            table[a, b] = table[a].max() + 6.0
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        # The final norm scales a one-hot state to sqrt(hidden).
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, :vocab] = table.T / hidden ** 0.5
    model.generation_config.eos_token_id = ends
    model.generation_config.pad_token_id = ends[1]
    model.generation_config.max_new_tokens = 12
    model.generation_config.max_length = None
    return _save(model, fast, out_dir)
