"""Makes tests/data/comet_tiny: tiny random COMET checkpoints in COMET's published layout, built
with unbabel-comet's own classes, and what its `predict` gives them (the reference vectors of
tests/test_comet.py and tests/test_comet_unified.py). The suite only reads what this wrote.

`python scripts/make_comet_fixture.py regression` makes the two regression checkpoints
(wmt22_like, wmt20_like) and reference_scores.json; `... unified` the unified ones (kiwi_like:
a CometKiwi-style UnifiedMetric on [mt, src]; unified_spans_like: a word-level UnifiedMetric on
all three segments; xcomet_like: an XCOMETMetric on a tiny XLM-R-XL encoder, its hparams.yaml
saying sparsemax_patch as the hub's XCOMET ones do) and reference_unified.json: per model and
input set (with references, without) the scores, the error spans and the system score.

unbabel-comet cannot be installed beside this project (it needs transformers<5, numpy<2), so
this runs in two environments:

1. this project's venv (transformers 5): `python scripts/make_comet_fixture.py` trains a small
   sentencepiece model on data_samples/translation and saves an XLM-R tokenizer and config;
   then it runs step 2 with the side environment's python.
2. the side environment: `python3 -m venv /work/venv-cometref && /work/venv-cometref/bin/pip
   install unbabel-comet==2.2.7 torch==2.13.0 "setuptools>=77.0.3,<81"` (torch 2.13 needs
   setuptools>=77; torchmetrics 0.10 imports pkg_resources, which setuptools 81 drops).
   `COMET_PYTHON=/work/venv-cometref/bin/python` picks it (that path is the default).
   There `RegressionMetric(..., load_pretrained_weights=False)` is built on that folder, every
   parameter moved away from its initial value, saved as hparams.yaml + checkpoints/model.ckpt,
   reloaded with comet.load_from_checkpoint and scored with predict(..., gpus=0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "comet_tiny"
ENCODER = "tiny-xlmr"  # hparams.yaml's pretrained_model: a folder of that name beside it
VARIANTS = {
    # wmt22-comet-da's head: sparsemax layer mix, no layer norm
    "wmt22_like": {"layer_transformation": "sparsemax", "layer_norm": False, "layer_weights": [0.2, -0.5, 0.4, 0.9]},
    # wmt20-comet-da's head: softmax layer mix with layer norm
    "wmt20_like": {"layer_transformation": "softmax", "layer_norm": True, "layer_weights": [0.3, -0.2, 0.1, 0.6]},
}


def samples() -> dict[str, list[str]]:
    """24 sources with their references, translations of four kinds (the reference, a shuffled
    one, another example's reference, a cut one), and a second reference set."""
    data = ROOT / "data_samples" / "translation"
    src = (data / "test.source").read_text(encoding="utf-8").splitlines()[:24]
    ref = (data / "test.target").read_text(encoding="utf-8").splitlines()[:24]
    mt = []
    for i, r in enumerate(ref):
        words = r.split()
        mt.append([r, " ".join(reversed(words)), ref[(i + 5) % len(ref)], " ".join(words[: max(1, len(words) // 2)])][i % 4])
    ref2 = [" ".join(r.split()[1:] + r.split()[:1]) for r in ref]
    return {"src": src, "mt": mt, "ref": ref, "ref2": ref2}


def make_encoder(folder: Path) -> None:
    """Tokenizer and config under transformers 5 (the side environment's protobuf<5 cannot turn a
    sentencepiece model into a fast tokenizer; it loads the tokenizer.json written here)."""
    import sentencepiece as spm
    from transformers import XLMRobertaConfig, XLMRobertaTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "data_samples" / "translation" / "train.source").read_text(encoding="utf-8").splitlines()[:3000]
    text += (ROOT / "data_samples" / "translation" / "train.target").read_text(encoding="utf-8").splitlines()[:3000]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(text), encoding="utf-8")
        spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(Path(tmp) / "sp"), vocab_size=600,
                                       model_type="unigram", character_coverage=1.0, num_threads=1,
                                       minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=str(Path(tmp) / "sp.model"))
        # XLM-R's (fairseq's) ids: <s> <pad> </s> <unk>, then the pieces after sentencepiece's own
        # <unk> <s> </s> (each id + 1), <mask> last.
        pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())]
        vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *pieces, ("<mask>", 0.0)]
        tok = XLMRobertaTokenizer(vocab=vocab)
    tok.model_max_length = 126
    tok.save_pretrained(str(folder))
    config = XLMRobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=130, type_vocab_size=1,
                              pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config.save_pretrained(str(folder))


def make_xl_encoder(base: Path, folder: Path) -> None:
    """The same tokenizer beside a tiny XLM-R-XL config (pre-layer-norm layers, a last layer norm)."""
    import shutil

    from transformers import XLMRobertaXLConfig

    shutil.copytree(base, folder)
    small = json.loads((base / "config.json").read_text(encoding="utf-8"))
    config = XLMRobertaXLConfig(vocab_size=small["vocab_size"], hidden_size=32, num_hidden_layers=3,
                                num_attention_heads=4, intermediate_size=64, max_position_embeddings=130,
                                type_vocab_size=1, pad_token_id=small["pad_token_id"],
                                bos_token_id=small["bos_token_id"], eos_token_id=small["eos_token_id"])
    (folder / "config.json").unlink()
    config.save_pretrained(str(folder))


UNIFIED = {
    "kiwi_like": {"class": "UnifiedMetric", "encoder": ENCODER, "args": {
        "input_segments": ["mt", "src"], "word_level_training": False, "layer_transformation": "sparsemax",
        "layer_norm": False, "layer_weights": [0.2, -0.5, 0.4, 0.9]}},
    "unified_spans_like": {"class": "UnifiedMetric", "encoder": ENCODER, "args": {
        "input_segments": ["mt", "src", "ref"], "word_level_training": True, "word_layer": 2,
        "error_labels": ["minor", "major"], "layer_transformation": "sparsemax", "layer_norm": True,
        "layer_weights": [0.3, 0.1, -0.4, 0.5]}},
    "xcomet_like": {"class": "XCOMETMetric", "encoder": ENCODER + "-xl", "args": {
        "word_layer": 3, "layer_transformation": "sparsemax_patch", "layer_norm": False,
        "layer_weights": [0.1, 0.6, -0.2, 0.3]}},
}


def unified_samples() -> dict[str, list[str]]:
    """The regression samples, then inputs that exercise the cuts and the spans' quirks: long
    sources and references (each cut, then the joined input), a long translation, an empty one,
    one with a literal "<pad>" (dropped from the joined input, as COMET drops pad ids)."""
    base = samples()
    data = ROOT / "data_samples" / "translation"
    src = (data / "val.source").read_text(encoding="utf-8").splitlines()
    ref = (data / "val.target").read_text(encoding="utf-8").splitlines()
    extra = [(" ".join(src[0:8]), ref[0], " ".join(ref[0:8])), (src[8], " ".join(ref[8:16]), ref[8]),
             (" ".join(src[16:20]), " ".join(ref[16:19]), " ".join(ref[20:23])), (src[30], "", ref[30]),
             (src[31], "Die <pad> Katze " + ref[31], ref[31])]
    for s, m, r in extra:
        base["src"].append(s)
        base["mt"].append(m)
        base["ref"].append(r)
    del base["ref2"]
    return base


SIDE_UNIFIED = r'''
import json, os, sys, shutil
from pathlib import Path
import torch, yaml
import pytorch_lightning as pl
from comet.models import UnifiedMetric, XCOMETMetric, load_from_checkpoint

root, out, variants, samples = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
torch.manual_seed(0)
result = {"samples": samples, "models": {}}
for name, v in variants.items():
    args = dict(v["args"])
    weights = args.pop("layer_weights")
    cls = {"UnifiedMetric": UnifiedMetric, "XCOMETMetric": XCOMETMetric}[v["class"]]
    encoder = root / v["encoder"]
    model = cls(pretrained_model=str(encoder), load_pretrained_weights=False, sent_layer="mix",
                hidden_sizes=[48, 16], activations="Tanh", final_activation=None, dropout=0.1,
                **({"encoder_model": "XLM-RoBERTa-XL"} if cls is XCOMETMetric else {}), **args)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # every parameter away from its initial value
        for p, w in zip(model.layerwise_attention.scalar_parameters, weights):
            p.fill_(w)
        if getattr(model, "hidden2tag", None) is not None:
            # Labels that change from token to token: spans of every severity, some at the start.
            model.hidden2tag.weight.normal_(0, 0.7)
            model.hidden2tag.bias.copy_(torch.tensor([0.3] + [0.0] * (model.hidden2tag.bias.numel() - 1)))
        model.estimator.ff[-1].bias.add_(0.4)  # scores around and above 1 (XCOMET clips at 1)
    folder = out / name
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    shutil.copytree(encoder, folder / encoder.name, dirs_exist_ok=True)
    hparams = dict(model.hparams)
    hparams["pretrained_model"] = encoder.name  # found beside hparams.yaml, as offline use does
    (folder / "hparams.yaml").write_text(yaml.dump(hparams), encoding="utf-8")
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hparams, "epoch": 0, "global_step": 0,
                "pytorch-lightning_version": pl.__version__}, folder / "checkpoints" / "model.ckpt")
    os.chdir(folder)  # pretrained_model is a folder name relative to here
    loaded = load_from_checkpoint(str(folder / "checkpoints" / "model.ckpt"), local_files_only=True)
    runs = {}
    for inputs in ("with_ref", "no_ref"):
        keys = ("src", "mt", "ref") if inputs == "with_ref" else ("src", "mt")
        data = [{k: samples[k][i] for k in keys} for i in range(len(samples["mt"]))]
        pred = loaded.predict(data, batch_size=8, gpus=0, progress_bar=False)
        meta = pred.get("metadata") or {}
        runs[inputs] = {"scores": [float(x) for x in pred.scores], "system_score": float(pred.system_score),
                        "error_spans": meta.get("error_spans")}
    result["models"][name] = runs
result["versions"] = {"unbabel-comet": __import__("importlib.metadata").metadata.version("unbabel-comet"),
                      "torch": torch.__version__, "transformers": __import__("transformers").__version__}
(out / "reference_unified.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
'''


SIDE = r'''
import json, os, sys, shutil
from pathlib import Path
import torch, yaml
import pytorch_lightning as pl
from comet.models import RegressionMetric, load_from_checkpoint

encoder, out, variants, samples = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
torch.manual_seed(0)
result = {"samples": samples, "scores": {}}
for name, v in variants.items():
    model = RegressionMetric(pretrained_model=str(encoder), load_pretrained_weights=False, layer="mix",
                             layer_transformation=v["layer_transformation"], layer_norm=v["layer_norm"], pool="avg",
                             hidden_sizes=[48, 16], activations="Tanh", final_activation=None, dropout=0.1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # every parameter away from its initial value
        for p, w in zip(model.layerwise_attention.scalar_parameters, v["layer_weights"]):
            p.fill_(w)
    folder = out / name
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    shutil.copytree(encoder, folder / encoder.name, dirs_exist_ok=True)
    hparams = dict(model.hparams)
    hparams["pretrained_model"] = encoder.name  # found beside hparams.yaml, as offline use does
    (folder / "hparams.yaml").write_text(yaml.dump(hparams), encoding="utf-8")
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hparams, "epoch": 0, "global_step": 0,
                "pytorch-lightning_version": pl.__version__}, folder / "checkpoints" / "model.ckpt")
    os.chdir(folder)  # pretrained_model is a folder name relative to here
    loaded = load_from_checkpoint(str(folder / "checkpoints" / "model.ckpt"), local_files_only=True)
    scores = {}
    for refs in ("ref", "ref2"):
        data = [{"src": s, "mt": m, "ref": r} for s, m, r in zip(samples["src"], samples["mt"], samples[refs])]
        scores[refs] = [float(x) for x in loaded.predict(data, batch_size=8, gpus=0, progress_bar=False).scores]
    result["scores"][name] = scores
result["versions"] = {"unbabel-comet": __import__("importlib.metadata").metadata.version("unbabel-comet"),
                      "torch": torch.__version__, "transformers": __import__("transformers").__version__}
(out / "reference_scores.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
'''


def main() -> None:
    python = os.environ.get("COMET_PYTHON", "/work/venv-cometref/bin/python")
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryDirectory() as tmp:
        encoder = Path(tmp) / ENCODER
        make_encoder(encoder)
        if which in ("regression", "all"):
            subprocess.run([python, "-c", SIDE, str(encoder), str(OUT), json.dumps(VARIANTS), json.dumps(samples())],
                           check=True, env=env)
        if which in ("unified", "all"):
            make_xl_encoder(encoder, Path(tmp) / (ENCODER + "-xl"))
            subprocess.run([python, "-c", SIDE_UNIFIED, tmp, str(OUT), json.dumps(UNIFIED),
                            json.dumps(unified_samples())], check=True, env=env)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    sys.exit(main())
