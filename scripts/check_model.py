"""Score the embedded model on the sample test sets with plain Hugging Face generate.

    python scripts/check_model.py [--model data_samples/model] [--n 100]

Prints corpus BLEU (sacrebleu) for translation and mean rougeL F-measure x 100 (rouge-score, with
stemming) for summarization, using each task's task_specific_params (prefix, beams, max_length):
an independent check of the numbers the evaluator should reproduce.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything this script needs is on disk

import torch

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO / "data_samples"
# Data files are read as the evaluator reads them (split on "\n" only, UTF-8 checked).
sys.path.insert(0, str(REPO))
from seq2seq_eval.inputs.files import read_lines  # noqa: E402


def generate(model, tokenizer, sources: list[str], params: dict, batch_size: int) -> list[str]:
    """Batches of similar length (padding is wasted work), results put back in input order."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    preds: list[str] = [""] * len(sources)
    gen_kwargs = {k: v for k, v in params.items() if k != "prefix"}
    for start in range(0, len(order), batch_size):
        ids = order[start : start + batch_size]
        batch = tokenizer([params["prefix"] + sources[i] for i in ids], return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(**batch, **gen_kwargs)
        texts = tokenizer.batch_decode(out, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        for i, text in zip(ids, texts):
            preds[i] = text.strip()
    return preds


def score(task: str, preds: list[str], refs: list[str]) -> float:
    if task == "translation":
        import sacrebleu

        return sacrebleu.corpus_bleu(preds, [refs]).score
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return 100 * sum(scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(preds, refs)) / len(refs)


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DATA_DIR / "model")
    parser.add_argument("--data_dir", type=Path, default=DATA_DIR)
    parser.add_argument("--split", default="test")
    parser.add_argument("--n", type=int, default=None, help="score only the first N examples")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--show", type=int, default=0, help="print the first N mistakes")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    for task, metric in (("translation", "BLEU"), ("summarization", "rougeL")):
        sources = read_lines(args.data_dir / task / f"{args.split}.source")[: args.n]
        refs = read_lines(args.data_dir / task / f"{args.split}.target")[: args.n]
        start = time.time()
        preds = generate(model, tokenizer, sources, model.config.task_specific_params[task], args.batch_size)
        seconds = time.time() - start
        exact = sum(p == r for p, r in zip(preds, refs))
        print(f"{task}: {metric} {score(task, preds, refs):.2f}  exact {exact}/{len(refs)}  "
              f"generation {seconds:.1f}s on {args.threads} thread(s)")
        for p, r in [(p, r) for p, r in zip(preds, refs) if p != r][: args.show]:
            print(f"  ref:  {r}\n  pred: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
