"""Makes tests/data/bertscore_tiny: a tiny random BERT-style and RoBERTa-style encoder (each with
a tokenizer trained on data_samples), a baseline file of made-up values, and the per-example
precision, recall and F1 that bert-score 0.3.13's own `score()` gives them (the reference
vectors of tests/test_bertscore.py). The suite only reads what this wrote.

Two steps, in two environments:

1. this project's venv: `python scripts/make_bertscore_fixture.py` trains the tokenizers (a
   WordPiece one, a byte-level BPE one), builds the encoders and saves them with
   save_pretrained; then it runs step 2 with the side environment's python.
2. the side environment, where bert-score 0.3.13 is installed. It installs beside this project's
   torch 2.13 and transformers 5: `python3 -m venv /work/venv-bertscore`, a .pth file in its
   site-packages naming this project's site-packages (so torch and transformers are the same),
   then `/work/venv-bertscore/bin/pip install bert-score==0.3.13` (it adds matplotlib and
   requests). `BERTSCORE_PYTHON=/work/venv-bertscore/bin/python` picks it (that path is the
   default). There `bert_score.score(..., model_type=<folder>, num_layers=3)` scores the
   samples, idf off and on, one reference and two (bert-score keeps the highest of each of P, R
   and F), and once rescaled with the baseline file (`baseline_path`), with batch_size=8.

The encoders' layers add a shared offset (their output LayerNorm's bias), so that their token
embeddings point the same way, as real encoders' do (cosine similarities mostly above 0): this
step checks that every token's best match has a similarity above 0 (see docs/metrics.md,
BERTScore's "Parity", for why bert-score's value would otherwise depend on its batch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "bertscore_tiny"
LAYERS = 3  # of 4: the model is cut, as bert-score cuts it
KINDS = {"bert": {"init": 0.1, "seed": 1}, "roberta": {"init": 0.2, "seed": 2}}
BASELINE = "LAYER,P,R,F\n0,0.61,0.62,0.615\n1,0.52,0.55,0.535\n2,0.43,0.41,0.42\n3,0.35,0.38,0.365\n4,0.3,0.31,0.305\n"


def samples() -> dict[str, list[str]]:
    """24 English references (summaries) with candidates of four kinds (the reference, its words
    reversed, another example's reference, its first half), and a second reference set."""
    data = ROOT / "data_samples" / "summarization"
    ref = (data / "test.target").read_text(encoding="utf-8").splitlines()[:24]
    mt = []
    for i, r in enumerate(ref):
        words = r.split()
        mt.append([r, " ".join(reversed(words)), ref[(i + 5) % len(ref)], " ".join(words[: max(1, len(words) // 2)])][i % 4])
    ref2 = [" ".join(r.split()[2:] + r.split()[:2]) for r in ref]
    return {"mt": mt, "ref": ref, "ref2": ref2}


def _corpus() -> list[str]:
    data = ROOT / "data_samples" / "summarization"
    return ((data / "train.source").read_text(encoding="utf-8").splitlines()[:2000]
            + (data / "train.target").read_text(encoding="utf-8").splitlines()[:2000])


def make_tokenizer(kind: str, folder: Path) -> None:
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer
    from transformers import BertTokenizer, RobertaTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(_corpus()), encoding="utf-8")
        if kind == "bert":
            trainer = BertWordPieceTokenizer(lowercase=True)
            trainer.train([str(corpus)], vocab_size=800, min_frequency=2)
            trainer.save_model(tmp)
            tok = BertTokenizer(vocab=str(Path(tmp) / "vocab.txt"), do_lower_case=True)
        else:
            trainer = ByteLevelBPETokenizer()
            trainer.train([str(corpus)], vocab_size=800, min_frequency=2,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
            trainer.save_model(tmp)
            tok = RobertaTokenizer(vocab=str(Path(tmp) / "vocab.json"), merges=str(Path(tmp) / "merges.txt"))
    tok.model_max_length = 64
    tok.save_pretrained(str(folder))


def make_encoder(kind: str, folder: Path) -> None:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, RobertaConfig, RobertaModel

    torch.manual_seed(KINDS[kind]["seed"])
    tok = AutoTokenizer.from_pretrained(str(folder))
    common = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                  pad_token_id=tok.pad_token_id, initializer_range=KINDS[kind]["init"])
    if kind == "bert":
        model = BertModel(BertConfig(max_position_embeddings=64, **common))
    else:
        model = RobertaModel(RobertaConfig(max_position_embeddings=66, bos_token_id=tok.bos_token_id,
                                           eos_token_id=tok.eos_token_id, **common))
    with torch.no_grad():
        shared = 0.15 * (torch.rand(32) + 0.5)
        for layer in model.encoder.layer:
            layer.output.LayerNorm.bias.copy_(shared + 0.1 * torch.randn(32))
            layer.output.LayerNorm.weight.copy_(1 + 0.1 * torch.randn(32))
    model.save_pretrained(str(folder))


def check_best_matches(kind: str, folder: Path, data: dict[str, list[str]]) -> float:
    """The lowest best-match similarity of any token of any pair (candidate or reference side)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    model.encoder.layer = model.encoder.layer[:LAYERS]

    def emb(text: str) -> torch.Tensor:
        with torch.no_grad():
            h = model(**tok(text, return_tensors="pt"))[0][0]
        return h / h.norm(dim=-1, keepdim=True)

    low = 1.0
    for mt, r1, r2 in zip(data["mt"], data["ref"], data["ref2"]):
        for ref in (r1, r2):
            sim = emb(mt) @ emb(ref).T
            low = min(low, float(sim.max(dim=1)[0].min()), float(sim.max(dim=0)[0].min()))
    return low


SIDE = r'''
import json, sys
import torch
from bert_score import score

torch.set_num_threads(1)
folder, data, layers = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
two = [[a, b] for a, b in zip(data["ref"], data["ref2"])]
out = {}
for kind in ("bert", "roberta"):
    for idf in (False, True):
        for name, refs in (("ref", data["ref"]), ("two", two)):
            p, r, f = score(data["mt"], refs, model_type=f"{folder}/{kind}", num_layers=layers, idf=idf, batch_size=8,
                            nthreads=0, device="cpu")
            out[f"{kind}|idf={idf}|{name}"] = {"P": p.tolist(), "R": r.tolist(), "F": f.tolist()}
    p, r, f = score(data["mt"], two, model_type=f"{folder}/{kind}", num_layers=layers, idf=True, batch_size=8, nthreads=0,
                    device="cpu", lang="en", rescale_with_baseline=True, baseline_path=f"{folder}/baseline.tsv")
    out[f"{kind}|idf=True|two|rescaled"] = {"P": p.tolist(), "R": r.tolist(), "F": f.tolist()}
import importlib.metadata, transformers
print(json.dumps({"scores": out, "versions": {"bert-score": importlib.metadata.version("bert-score"),
                  "torch": torch.__version__, "transformers": transformers.__version__}}))
'''


def side_scores(python: str, folder: Path, data: dict[str, list[str]]) -> dict:
    """bert-score's own scores of the fixture, from the side environment's python."""
    proc = subprocess.run([python, "-c", SIDE, str(folder), json.dumps(data), str(LAYERS)], capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode:
        raise RuntimeError(f"bert-score failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    python = os.environ.get("BERTSCORE_PYTHON", "/work/venv-bertscore/bin/python")
    data = samples()
    OUT.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        make_tokenizer(kind, OUT / kind)
        make_encoder(kind, OUT / kind)
        low = check_best_matches(kind, OUT / kind, data)
        if low <= 0:
            raise SystemExit(f"{kind}: a token's best match has similarity {low:.3f}; change its seed")
        print(f"{kind}: lowest best-match similarity {low:.3f}")
    (OUT / "baseline.tsv").write_text(BASELINE, encoding="utf-8")
    result = {"samples": data, "layers": LAYERS, **side_scores(python, OUT, data)}
    (OUT / "reference_scores.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    sys.exit(main())
