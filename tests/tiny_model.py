"""A tiny randomly initialised T5 with a word-level tokenizer, built offline for tests.

Random weights generate nonsense, but deterministic nonsense: exactly what world-size
invariance, merge and resume tests need. Tests of score quality use the embedded trained model.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_t5(out_dir: Path, corpus: list[str], seed: int = 0, task_params: dict | None = None) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"], vocab_size=2000)
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=tok.get_vocab_size(), d_model=32, d_ff=64, d_kv=8, num_heads=4,
        num_layers=2, num_decoder_layers=2, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        task_specific_params=task_params or {
            "translation": {"num_beams": 2, "max_length": 12},
            "summarization": {"num_beams": 2, "max_length": 10},
        },
    )
    model = T5ForConditionalGeneration(config).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    fast.save_pretrained(out_dir)
    return out_dir
