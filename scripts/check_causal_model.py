"""Score the embedded causal demo model on the sample test sets with a plain generate() loop.

    python scripts/check_causal_model.py [--model data_samples/causal_model] [--n 100]

Each prompt goes through the model's chat template (the task entry's prefix and the source as the
user's turn) and is generated alone, with the task entry's settings (beams, max_new_tokens); the
continuation is decoded without special tokens. Prints corpus BLEU (sacrebleu) for translation and
mean rougeL F-measure x 100 (rouge-score, with stemming) for summarization: an independent check of
the numbers the evaluator should reproduce with --apply_chat_template.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything this script needs is on disk

import torch

from check_model import DATA_DIR, read_lines, score


def generate(model, tokenizer, sources: list[str], params: dict) -> list[str]:
    gen_kwargs = {k: v for k, v in params.items() if k != "prefix"}
    preds = []
    for source in sources:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": params["prefix"] + source}],
                                            add_generation_prompt=True, tokenize=True, return_dict=False)
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 **gen_kwargs)
        preds.append(tokenizer.decode(out[0, len(ids):], skip_special_tokens=True,
                                      clean_up_tokenization_spaces=False).strip())
    return preds


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DATA_DIR / "causal_model")
    parser.add_argument("--data_dir", type=Path, default=DATA_DIR)
    parser.add_argument("--split", default="test")
    parser.add_argument("--n", type=int, default=None, help="score only the first N examples")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    for task, metric in (("translation", "BLEU"), ("summarization", "rougeL")):
        sources = read_lines(args.data_dir / task / f"{args.split}.source")[: args.n]
        refs = read_lines(args.data_dir / task / f"{args.split}.target")[: args.n]
        start = time.time()
        preds = generate(model, tokenizer, sources, model.config.task_specific_params[task])
        exact = sum(p == r for p, r in zip(preds, refs))
        print(f"{task}: {metric} {score(task, preds, refs):.2f}  exact {exact}/{len(refs)}  "
              f"generation {time.time() - start:.1f}s on {args.threads} thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
