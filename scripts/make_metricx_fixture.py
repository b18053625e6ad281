"""Makes tests/data/metricx_tiny: a tiny random checkpoint shaped as MetricX's MT5ForRegression (the
hub's layout: config.json naming MT5ForRegression, mT5's 250112-entry vocabulary, so the logit of
id 250089 exists), a sentencepiece tokenizer, and the per-example scores google-research/metricx's
own model code gives them (the reference values of tests/test_metricx.py). The suite only reads
what this wrote.

MetricX's code pins transformers 4.30.2, which cannot be installed beside this project
(transformers 5), so this runs in two environments:

1. this project's venv: `python scripts/make_metricx_fixture.py` trains a sentencepiece model on
   data_samples/translation (pad 0, eos 1, unk 2, as mT5's), builds the tokenizer folder and a
   random checkpoint (float32 and a bfloat16 copy), then runs step 2 with the side environment's
   python.
2. the side environment: `python3 -m venv /work/side/venv-metricxref && /work/side/venv-metricxref/
   bin/pip install torch==2.13.0 transformers==4.30.2 sentencepiece "numpy<2" "protobuf<5"`, and
   a checkout of google-research/metricx (`METRICX_REPO`, its root; `METRICX_PYTHON` picks the
   python). There `metricx24.models.MT5ForRegression.from_pretrained(folder, torch_dtype="auto")`
   is loaded and, per example, the input is built as `predict.py`'s `_make_input` (24 and 23,
   with and without reference), tokenized with `AutoTokenizer` under transformers 4.30.2
   (`max_length`, `truncation=True`), its last token (the end token) removed as `_remove_eos`
   does, and scored one example at a time (`predictions` of the forward pass). The differences
   from `predict.py`, named: the inputs come from a Python list instead of `datasets`' json
   loader, and the loop calls the model under `torch.no_grad()` instead of
   `Trainer.predict(batch_size=1)` (which does the same forward pass in eval mode, without
   gradients; neither package is needed then).

The checkpoint's embedding rows past the tokenizer's vocabulary and the output rows but 250089
are zero, so that the xz-compressed file stays small; the output row 250089 points along the
decoder's mean output, so that most scores fall inside (0, 25) and some are clamped.
"""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "metricx_tiny"
SCORE_ID = 250089
VOCAB = 250112


def samples() -> dict[str, list[str]]:
    """16 sources with references and translations of four kinds (the reference, reversed words,
    another example's reference, a cut one); one long example that the 23/24 lengths cut."""
    data = ROOT / "data_samples" / "translation"
    src = (data / "test.source").read_text(encoding="utf-8").splitlines()[:16]
    ref = (data / "test.target").read_text(encoding="utf-8").splitlines()[:16]
    mt = []
    for i, r in enumerate(ref):
        words = r.split()
        mt.append([r, " ".join(reversed(words)), ref[(i + 5) % len(ref)], " ".join(words[: max(1, len(words) // 2)])][i % 4])
    src[3] = " ".join([src[3]] * 6)  # longer than --metricx_max_length 64 below: truncated
    return {"src": src, "mt": mt, "ref": ref}


CASES = {
    # name: (version, qe, max_length, dtype)
    "24": ("24", False, 1536, "float32"),
    "24_qe": ("24", True, 1536, "float32"),
    "23": ("23", False, 1024, "float32"),
    "23_qe": ("23", True, 1024, "float32"),
    "24_cut": ("24", False, 64, "float32"),
    "24_bf16": ("24", False, 1536, "bfloat16"),
}


def make_tokenizer(folder: Path) -> None:
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    data = ROOT / "data_samples" / "translation"
    text = (data / "train.source").read_text(encoding="utf-8").splitlines()[:3000]
    text += (data / "train.target").read_text(encoding="utf-8").splitlines()[:3000]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(text), encoding="utf-8")
        spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(Path(tmp) / "spiece"), vocab_size=500,
                                       model_type="unigram", character_coverage=1.0, num_threads=1, pad_id=0,
                                       eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
        (folder / "spiece.model").write_bytes((Path(tmp) / "spiece.model").read_bytes())
    # mT5's tokenizer_config: no extra ids (its spiece.model holds them).
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "eos_token": "</s>", "unk_token": "<unk>",
         "pad_token": "<pad>"}), encoding="utf-8")


def side(*args: str) -> str:
    """Runs SIDE in the side environment; its last line of output."""
    python = os.environ.get("METRICX_PYTHON", "/work/side/venv-metricxref/bin/python")
    repo = os.environ.get("METRICX_REPO", "/work/side/metricx")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "side.py"
        script.write_text(SIDE, encoding="utf-8")
        # protobuf 4 with transformers 4.30's generated sentencepiece_model_pb2: the pure-Python parser.
        env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
        done = subprocess.run([python, str(script), repo, *args], capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        sys.exit(done.stderr)
    return done.stdout.strip().splitlines()[-1]


def convert_tokenizer(folder: Path) -> None:
    """The fast tokenizer transformers 4.30.2 makes of spiece.model (what MetricX's code loads),
    saved beside it as tokenizer.json; and that file alone in a folder of its own."""
    side("tokenizer", str(folder))
    only_json = folder.parent / "tokenizer_json_only"
    only_json.mkdir(exist_ok=True)
    (only_json / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())


def make_checkpoint(folder: Path, tokenizer_folder: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, MT5Config, MT5ForConditionalGeneration

    torch.manual_seed(0)
    config = MT5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=1, num_heads=2,
                       relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                       feed_forward_proj="gated-gelu", tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
                       decoder_start_token_id=0)
    model = MT5ForConditionalGeneration(config).eval()
    # transformers 5's MT5Config forces tie_word_embeddings True; MetricX's checkpoints have their own lm_head.
    model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    tok = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    with torch.no_grad():
        for p in model.parameters():  # well away from the initial values, none tiny
            p.copy_(torch.randn_like(p) * 0.5)
        model.shared.weight[len(tok):] = 0
        model.lm_head.weight.zero_()
        # The decoder's output for every fixture input: the score row points along its mean.
        s = samples()
        texts = [f"source: {a} candidate: {b} reference: {c}" for a, b, c in zip(s["src"], s["mt"], s["ref"])]
        enc = tok(texts, padding=True, return_tensors="pt")
        hidden = model.encoder(input_ids=enc.input_ids, attention_mask=enc.attention_mask).last_hidden_state
        dec = model.decoder(input_ids=torch.zeros(len(texts), 1, dtype=torch.long), encoder_hidden_states=hidden,
                            encoder_attention_mask=enc.attention_mask).last_hidden_state[:, 0]
        mean = dec.mean(0)
        model.lm_head.weight[SCORE_ID] = 12 * mean / mean.dot(mean) + torch.randn_like(mean) * 2.0
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in ("encoder.embed_tokens.weight",
                                                                                     "decoder.embed_tokens.weight")}
    for dtype, sub in (("float32", folder / "float32"), ("bfloat16", folder / "bfloat16")):
        sub.mkdir(parents=True, exist_ok=True)
        raw = Path(tempfile.mkdtemp()) / "model.safetensors"
        save_file({k: v.to(getattr(torch, dtype)) for k, v in state.items()}, str(raw), metadata={"format": "pt"})
        (sub / "model.safetensors.xz").write_bytes(lzma.compress(raw.read_bytes(), preset=9))
        cfg = config.to_dict()
        cfg.update(architectures=["MT5ForRegression"], torch_dtype=dtype, tie_word_embeddings=False)
        for k in ("dtype", "transformers_version"):
            cfg.pop(k, None)
        (sub / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


def expand(sub: Path, into: Path) -> Path:
    """The checkpoint folder as the hub holds it: config.json and model.safetensors."""
    into.mkdir(parents=True, exist_ok=True)
    (into / "config.json").write_bytes((sub / "config.json").read_bytes())
    (into / "model.safetensors").write_bytes(lzma.decompress((sub / "model.safetensors.xz").read_bytes()))
    return into


SIDE = r'''
import json, sys
import torch, transformers
sys.path.insert(0, sys.argv[1])
from metricx24 import models  # metricx23's models.py is the same class

if sys.argv[2] == "tokenizer":
    transformers.AutoTokenizer.from_pretrained(sys.argv[3]).save_pretrained(sys.argv[3])
    print("saved")
    sys.exit(0)
spec = json.loads(open(sys.argv[3]).read())
tokenizer = transformers.AutoTokenizer.from_pretrained(spec["tokenizer"])
out = {"transformers": transformers.__version__, "cases": {}, "ids": {}}
for name, case in spec["cases"].items():
    model = models.MT5ForRegression.from_pretrained(case["model"], torch_dtype="auto").eval()
    scores, ids = [], []
    for s, h, r in zip(spec["src"], spec["mt"], spec["ref"]):
        # predict.py's _make_input (metricx24 / metricx23), _tokenize, _remove_eos
        if case["version"] == "24":
            text = "source: " + s + " candidate: " + h + ("" if case["qe"] else " reference: " + r)
        else:
            text = "candidate: " + h + (" source: " + s if case["qe"] else " reference: " + r)
        enc = tokenizer(text, max_length=case["max_length"], truncation=True, padding=False)
        input_ids, mask = enc["input_ids"][:-1], enc["attention_mask"][:-1]
        ids.append(input_ids)
        with torch.no_grad():
            pred = model(input_ids=torch.tensor([input_ids]), attention_mask=torch.tensor([mask])).predictions
        scores.append(float(pred[0]))
    out["cases"][name] = scores
    out["ids"][name] = ids
print(json.dumps(out))
'''


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer = OUT / "tokenizer"
    if not (tokenizer / "tokenizer.json").exists():
        make_tokenizer(tokenizer)
        convert_tokenizer(tokenizer)
    make_checkpoint(OUT, tokenizer)
    s = samples()
    with tempfile.TemporaryDirectory() as tmp:
        folders = {d: str(expand(OUT / d, Path(tmp) / d)) for d in ("float32", "bfloat16")}
        cases = {name: {"version": v, "qe": qe, "max_length": n, "model": folders[dtype]}
                 for name, (v, qe, n, dtype) in CASES.items()}
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"tokenizer": str(tokenizer), "cases": cases, **s}), encoding="utf-8")
        line = side("score", str(spec))
    result = json.loads(line)
    reference = {"made_with": f"google-research/metricx models.MT5ForRegression, transformers {result['transformers']}",
                 "cases": {name: {"version": v, "qe": qe, "max_length": n, "dtype": dtype}
                           for name, (v, qe, n, dtype) in CASES.items()},
                 **s, "scores": result["cases"], "ids": result["ids"]}
    (OUT / "reference.json").write_text(json.dumps(reference, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print({name: [round(x, 3) for x in v] for name, v in result["cases"].items()})


if __name__ == "__main__":
    main()
