"""What a CTranslate2 conversion is of, and what happens to a damaged one.

The conversion cache is keyed by what decides the converted weights: a hub name's resolved
snapshot, not only its name. A cache entry that fails its check (a file missing or truncated) is
converted again, with nothing left behind. Runs go through the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_ok, metrics_of, single
from tiny_model import build_tiny_t5

pytest.importorskip("ctranslate2", reason='the ctranslate2 extra is not installed (pip install -e ".[ctranslate2]")')

from seq2seq_eval.config import EMBEDDED_DATA  # noqa: E402

# --early_stopping true: the tiny T5's task entry asks for beams and leaves it unset, which
# CTranslate2 refuses (its beam search stops as early_stopping=True does).
CT2 = ["--engine", "ctranslate2", "--n_obs", "8", "--early_stopping", "true"]
SHA = {1: "1" * 40, 2: "2" * 40}


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "ctranslate2").iterdir())


def _fake_hub(root: Path) -> Path:
    """A hub cache as huggingface_hub lays it out (refs/main naming a snapshot folder), holding
    two revisions of org/tiny: two tiny T5 models with different weights and one vocabulary."""
    corpus = (EMBEDDED_DATA["translation"] / "test.source").read_text().splitlines()
    repo = root / "models--org--tiny"
    for n, sha in SHA.items():
        build_tiny_t5(repo / "snapshots" / sha, corpus, seed=n)
    (repo / "refs").mkdir(parents=True)
    return repo


def test_a_moved_hub_revision_is_converted_again_and_named(tmp_path):
    hub, cache = tmp_path / "hub", tmp_path / "cache"
    repo = _fake_hub(hub)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "HF_HOME": str(tmp_path / "hf"),
           "SEQ2SEQ_EVAL_CACHE": str(cache)}
    outs = {}
    for n in (1, 2):
        (repo / "refs" / "main").write_text(SHA[n])
        outs[n] = tmp_path / f"rev{n}"
        # A new interpreter: huggingface_hub reads its cache location when imported.
        proc = single([*CT2, "--model_name", "org/tiny", "--save_dir", str(outs[n])], cwd=tmp_path, env=env, fresh=True)
        assert_ok(proc)
        assert f"(revision {SHA[n]})" in proc.stderr  # converted, not the other revision's entry reused
        assert metrics_of(outs[n])["provenance"]["model"]["revision"] == SHA[n]
    assert len([e for e in _entries(cache) if not e.endswith(".lock")]) == 2
    # The second run generated with the second revision's weights: what that snapshot's own
    # folder gives, and not what the first revision gave. (A folder by its path: no hub lookup,
    # so no new interpreter needed for it.)
    direct = tmp_path / "direct"
    assert_ok(single([*CT2, "--model_name", str(repo / "snapshots" / SHA[2]), "--save_dir", str(direct)],
                     cwd=tmp_path, env=env))
    texts = {n: (outs[n] / "test_generations.txt").read_text() for n in (1, 2)}
    assert texts[2] == (direct / "test_generations.txt").read_text() and texts[1] != texts[2]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """One run of the embedded model, its conversion in a cache of this module's own."""
    root = tmp_path_factory.mktemp("damaged")
    cache, save = root / "cache", root / "first"
    assert_ok(single([*CT2, "--save_dir", str(save)], cwd=root, env={"SEQ2SEQ_EVAL_CACHE": str(cache)}))
    (entry,) = [p for p in (cache / "ctranslate2").iterdir() if p.is_dir()]
    return root, cache, entry, (save / "test_generations.txt").read_text()


def _damage(entry: Path, how: str) -> None:
    model = entry / "model.bin"
    if how == "missing model.bin":
        model.unlink()
    elif how == "truncated model.bin":
        data = model.read_bytes()
        model.write_bytes(data[: len(data) // 2])
    elif how == "no completion marker":
        (entry / "seq2seq_eval_complete.json").unlink()


@pytest.mark.parametrize("how", ["missing model.bin", "truncated model.bin", "no completion marker"])
def test_a_damaged_conversion_is_converted_again(converted, how):
    root, cache, entry, first = converted
    _damage(entry, how)
    for attempt in (1, 2):  # repaired once, then used as it is
        save = root / f"{how.replace(' ', '_')}_{attempt}"
        proc = single([*CT2, "--save_dir", str(save)], cwd=root, env={"SEQ2SEQ_EVAL_CACHE": str(cache)})
        assert_ok(proc)
        assert ("damaged CTranslate2 conversion" in proc.stderr) == (attempt == 1), proc.stderr
        assert ("converting " in proc.stderr) == (attempt == 1)
        assert (save / "test_generations.txt").read_text() == first
        assert not list((cache / "ctranslate2").glob("*.tmp-*"))
    marker = json.loads((entry / "seq2seq_eval_complete.json").read_text())
    assert marker["files"]["model.bin"]["bytes"] == (entry / "model.bin").stat().st_size

