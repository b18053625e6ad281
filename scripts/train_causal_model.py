"""Train the embedded causal demo model: one tiny Llama-style decoder-only LM for both sample
tasks, prompted through its own chat template.

    python scripts/make_data.py            # if data_samples/ is not there yet
    nice python scripts/train_causal_model.py   # writes data_samples/causal_model/

Each training sequence is what the evaluator gives the model with --apply_chat_template (the
task entry's prefix, then the source, as the user's turn), then the reference and the end token:

    <s>translate: {source}\\n{target}</s>

The loss is on the reference and the end token only. The chat template writes the BOS token and
the newline that ends the user's turn; the tokenizer adds BOS to plain text as Llama's does, so
`--prompt_template "{source}\\n"` gives the same token ids without the chat template. The
tokenizer is byte-level BPE (any text round-trips exactly; digits split one by one, so numbers
are copied digit by digit), trained here on the training data. Weights, batch order and
tokenizer are seeded: a rerun on the same machine and library versions reproduces the model.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from train_model import PREFIXES, parse_args, read_pairs, save_tokenizer, train

logger = logging.getLogger("train_causal_model")

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO / "data_samples"
BOS, EOS = "<s>", "</s>"  # ids 0 and 1; no padding token, as Llama's tokenizer has none
MAX_POSITIONS = 1024
# The user's turn ends with a newline, after which the answer starts; an answer ends with the end
# token. A system turn (--system_instruction) is a line of its own; this model was trained without
# one, and without earlier turns (few-shot examples), so both are accepted but not learned.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}"
    "{% else %}{{ message['content'] }}\n{% endif %}{% endfor %}"
)


@dataclass(frozen=True)
class TrainConfig:
    data_dir: Path = DATA_DIR
    """Holds translation/ and summarization/ with train.source and train.target."""
    out: Path = DATA_DIR / "causal_model"
    """Where the model and tokenizer are saved (overwritten)."""
    seed: int = 0
    vocab_size: int = 3000
    hidden_size: int = 192
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    epochs: int = 4
    lr: float = 2e-3
    warmup_steps: int = 300
    max_batch_tokens: int = 3000
    """Padded tokens (prompt and answer) per batch."""
    threads: int = 1
    """torch threads; one is the robust choice on a shared 2-core machine (see train_model.py)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "epochs",
                     "max_batch_tokens", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"--hidden_size ({self.hidden_size}) must be a multiple of --num_heads ({self.num_heads})")


def build_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (as Llama 3's and Qwen2's), BOS added to every text by the tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, tok.token_to_id(BOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                   model_max_length=MAX_POSITIONS, chat_template=CHAT_TEMPLATE)


def build_model(cfg: TrainConfig, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=None,
    )
    return LlamaForCausalLM(config)


Example = tuple[list[int], list[int]]  # prompt ids, answer ids (the end token included)


def encode(tokenizer, pairs: list[tuple[str, str]]) -> list[Example]:
    """The prompt as the evaluator builds it (chat template, tokenized without adding special
    tokens again), the answer as the continuation the model should generate."""
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": s}], tokenize=False,
                                             add_generation_prompt=True) for s, _ in pairs]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    answers = tokenizer([t for _, t in pairs], add_special_tokens=False)["input_ids"]
    return [(p, a + [tokenizer.eos_token_id]) for p, a in zip(prompt_ids, answers)]


def collate(examples: list[Example], ids: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (training needs no left padding: every position's loss is computed); labels
    only on the answer."""
    width = max(len(examples[i][0]) + len(examples[i][1]) for i in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(ids), width, dtype=torch.long)
    labels = torch.full((len(ids), width), -100, dtype=torch.long)
    for row, i in enumerate(ids):
        prompt, answer = examples[i]
        seq = prompt + answer
        input_ids[row, : len(seq)] = torch.tensor(seq)
        attention_mask[row, : len(seq)] = 1
        labels[row, len(prompt) : len(seq)] = torch.tensor(answer)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def max_new_tokens(tokenizer, pairs: list[tuple[str, str]]) -> int:
    """A generation cap above the longest training answer (its end token included), rounded up to
    a multiple of 8: tight enough that a runaway beam stops early."""
    longest = max(len(ids) for ids in tokenizer([t for _, t in pairs], add_special_tokens=False)["input_ids"]) + 1
    return int(math.ceil((longest + 8) / 8) * 8)


def save(model, tokenizer, cfg: TrainConfig, limits: dict[str, int]) -> None:
    # A decoder-only model's length limit is in new tokens: max_length would count the prompt.
    model.config.task_specific_params = {
        task: {"prefix": PREFIXES[task], "num_beams": 4, "max_new_tokens": limits[task], "early_stopping": True}
        for task in PREFIXES
    }
    model.generation_config.max_new_tokens = max(limits.values())
    model.generation_config.max_length = None
    cfg.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(cfg.out)
    save_tokenizer(tokenizer, cfg.out)


def run(cfg: TrainConfig) -> None:
    torch.set_num_threads(cfg.threads)
    start = time.time()
    pairs = {task: read_pairs(cfg.data_dir, task, "train") for task in PREFIXES}
    texts = [text for task_pairs in pairs.values() for pair in task_pairs for text in pair]
    tokenizer = build_tokenizer(texts, cfg.vocab_size)
    examples = [ex for task in PREFIXES for ex in encode(tokenizer, pairs[task])]
    model = build_model(cfg, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("%d training examples, vocabulary %d, %d parameters", len(examples), len(tokenizer), n_params)
    # Batches by the length of the whole sequence (prompt and answer), which collate pads to.
    train(model, examples, cfg, lambda ids: collate(examples, ids, tokenizer.eos_token_id),
          key=lambda example: (len(example[0]) + len(example[1]),))
    save(model, tokenizer, cfg, {task: max_new_tokens(tokenizer, [(s, t) for s, t in pairs[task]]) for task in PREFIXES})
    logger.info("saved %s in %.0fs", cfg.out, time.time() - start)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        run(parse_args(argv, TrainConfig, __doc__.splitlines()[0]))
    except (OSError, ValueError) as e:
        logger.error("train_causal_model: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
