"""Makes tests/data/comet_tiny: two tiny random COMET regression checkpoints in COMET's published
layout, built with unbabel-comet's own classes, and the per-example scores its `predict` gives
them (the reference vectors of tests/test_comet.py). The suite only reads what this wrote.

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
    with tempfile.TemporaryDirectory() as tmp:
        encoder = Path(tmp) / ENCODER
        make_encoder(encoder)
        subprocess.run([python, "-c", SIDE, str(encoder), str(OUT), json.dumps(VARIANTS), json.dumps(samples())],
                       check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    print(f"wrote {OUT}")


if __name__ == "__main__":
    sys.exit(main())
