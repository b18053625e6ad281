"""Error paths no other test reaches, each with the bad input a user could really give.

Through the command line a user types (forked by conftest.single) where the path is reached from
it: a JSON array given to --dataset, a --save_dir or --tmp_dir inside a --dataset folder, a
converted CTranslate2 folder whose model.bin or vocabulary is not one, a model folder whose
generation_config.json cannot be used. Every refusal is one line on stderr with the exit code of
its error type, naming the file or flag, and leaves neither --save_dir nor the temp dir behind.
A publish's recovery (outputs/publish.py) is reached only by a fault at the right moment, made by
wrapping os.rename or the copy: in-process on the library's Staging, and once through the command
line (a script that wraps os.rename, then calls the tool's main).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, make_corpus, single, write_legacy

from seq2seq_eval.config import EvalConfig
from seq2seq_eval.errors import OutputError
from seq2seq_eval.outputs import digest, intent, publish
from seq2seq_eval.outputs.locations import check_apart
from seq2seq_eval.outputs.publish import Staging
from seq2seq_eval.outputs.record import INTENT, RECORD, STAGING, OutputRecord

PREFIX = "seq2seq_eval: error: "
EMBEDDED = REPO / "data_samples" / "model"
CAUSAL = REPO / "data_samples" / "causal_model"
GENERATION_CONFIG = "generation_config.json"


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The command line's one error line; fails on a traceback, more lines, or output on stdout."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(PREFIX), f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip() == "", proc.stdout[-2000:]
    return lines[0]


def assert_refused(proc: subprocess.CompletedProcess, save: Path, exit_code: int, fragments: list[str]) -> None:
    line = refusal(proc)
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    assert proc.returncode == exit_code, f"exit {proc.returncode}: {line}"
    # Refused before any work: no output folder, no temp dir (made, then removed) left.
    assert not save.exists() and not Path(f"{save}_tmp").exists()


def model_variant(base: Path, folder: Path, generation_config: bytes | None) -> Path:
    """A model folder whose files are links to `base`'s, with its own generation_config.json:
    these bytes, or (None) a link to a file that is gone."""
    folder.mkdir(parents=True)
    for f in base.iterdir():
        if f.name != GENERATION_CONFIG:
            (folder / f.name).symlink_to(f)
    if generation_config is None:
        (folder / GENERATION_CONFIG).symlink_to(folder / "gone" / GENERATION_CONFIG)
    else:
        (folder / GENERATION_CONFIG).write_bytes(generation_config)
    return folder


def launch_all(cases: list, names: dict[str, Path]) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case's command line, side by side; the runs share nothing but read-only inputs.
    A case without its own data reads the small legacy set {ok} (--dataset replaces it)."""
    def launch(case_id: str, args: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
        save = names["root"] / f"save_{case_id}"
        data = [] if "--dataset" in args else ["--data_dir", "{ok}"]
        # Later flags win: a case's own --save_dir replaces this one.
        argv = [a.format(**names) for a in ["--model_name", "{m}", *data, "--bs", "4", "--save_dir", str(save), *args]]
        return single(argv, cwd=names["root"], timeout=180), save

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {c.values[0]: pool.submit(launch, c.values[0], c.values[1]) for c in cases}
        return {case_id: f.result() for case_id, f in futures.items()}


def case(case_id: str, args: list[str], exit_code: int, fragments: list[str]):
    """A table row."""
    return pytest.param(case_id, args, exit_code, fragments, id=case_id)


# ---------------------------------------------------------------- the command line's refusals
# Placeholders: {m} the embedded model, {ok} a valid legacy data folder, {d} the bad inputs,
# {g} the model folders with their own generation_config.json. Each case: id, arguments, exit
# code, fragments its one line must hold.

CASES = [
    # ---- a JSON array given as --dataset (inputs/jsonfile.py), read as --data_dir reads JSON Lines
    case("array-malformed", ["--dataset", "{d}/malformed.json"], 1,
         ["{d}/malformed.json: malformed JSON (Expecting ':' delimiter: line 2 column",
          "expected one JSON array of objects, or one object per line"]),
    case("array-item-not-an-object", ["--dataset", "{d}/item.json"], 1,
         ["{d}/item.json item 1: expected a JSON object, got list"]),
    case("array-item-not-an-object-dry-run", ["--dataset", "{d}/item.json", "--dry_run"], 1,
         ["{d}/item.json item 1: expected a JSON object, got list"]),
    case("array-empty", ["--dataset", "{d}/empty.json"], 1, ["{d}/empty.json: no records"]),
    # a Latin-1 file: not UTF-8
    case("array-latin1", ["--dataset", "{d}/latin1.json"], 1,
         ["{d}/latin1.json: malformed JSON ('utf-8' codec can't decode byte 0xe9"]),
    # the items' ids are checked as every input's; rows are numbered by position, from 0
    case("array-duplicated-id", ["--dataset", "{d}/dup.json"], 1,
         ["dataset {d}/dup.json split test row 1 column 'id': duplicated id 7 (first in row 0)"]),
    # ---- outputs inside a --dataset folder, which is read as a whole (outputs/locations.py
    # check_apart); that nothing was made in it is checked by the `runs` fixture
    case("save-dir-inside-dataset", ["--dataset", "{d}/mydata", "--save_dir", "{d}/mydata/out"], 2,
         ["--save_dir {d}/mydata/out: is inside the --dataset folder {d}/mydata, which is read as a whole",
          "expected --save_dir outside it"]),
    case("save-dir-is-dataset", ["--dataset", "{d}/mydata", "--save_dir", "{d}/mydata"], 2,
         ["--save_dir {d}/mydata: is inside the --dataset folder {d}/mydata"]),
    case("tmp-dir-inside-dataset", ["--dataset", "{d}/mydata", "--tmp_dir", "{d}/mydata/scratch"], 2,
         ["--tmp_dir {d}/mydata/scratch: is inside the --dataset folder {d}/mydata", "expected --tmp_dir outside it"]),
    case("save-dir-inside-dataset-through-a-link",
         ["--dataset", "{d}/mydata_link", "--save_dir", "{d}/mydata/out", "--dry_run"], 2,
         ["--save_dir {d}/mydata/out: is inside the --dataset folder {d}/mydata_link"]),
    case("save-dir-inside-dataset-relative", ["--dataset", "inputs/mydata/", "--save_dir", "inputs/x/../mydata/out"], 2,
         ["--save_dir inputs/x/../mydata/out: is inside the --dataset folder inputs/mydata/"]),
    # the other way round: a dataset inside --tmp_dir is a folder of files the tool did not make
    case("dataset-inside-tmp-dir", ["--dataset", "{d}/scratch/data", "--tmp_dir", "{d}/scratch"], 1,
         ["--tmp_dir {d}/scratch: holds files (data/test.jsonl) but no .seq2seq_eval_tmp marker"]),
    # ---- the model's generation_config.json (model/generation.py model_generation_config)
    case("generation-config-malformed", ["--model_name", "{g}/malformed"], 1,
         ["{g}/malformed/generation_config.json: not a readable generation config"]),
    case("generation-config-empty", ["--model_name", "{g}/empty"], 1,
         ["{g}/empty/generation_config.json: not a readable generation config"]),
    case("generation-config-bad-value", ["--model_name", "{g}/bad_value"], 1,
         ["{g}/bad_value/generation_config.json: not a usable generation config (`early_stopping` must be a boolean "
          "or 'never', but is soon.)"]),
    case("generation-config-not-an-object", ["--model_name", "{g}/list"], 1,
         ["{g}/list/generation_config.json: not a usable generation config"]),
    case("generation-config-wrong-kind-of-sub-config", ["--model_name", "{g}/watermark"], 1,
         ["{g}/watermark/generation_config.json: not a usable generation config"]),
    case("generation-config-dangling-link", ["--model_name", "{g}/dangling", "--dry_run"], 1,
         ["{g}/dangling/generation_config.json"]),
]


def _write_bad_inputs(d: Path) -> None:
    d.mkdir(parents=True)
    (d / "malformed.json").write_text('[{"source": "a b", "target": "c"},\n {"source": "d e", "target"}]\n',
                                      encoding="utf-8")
    (d / "item.json").write_text('[{"source": "a b", "target": "c"}, ["d e", "f"]]\n', encoding="utf-8")
    (d / "empty.json").write_text("[]\n", encoding="utf-8")
    (d / "latin1.json").write_bytes('[{"source": "un café", "target": "a coffee"}]\n'.encode("latin-1"))
    (d / "dup.json").write_text(json.dumps([{"id": 7, "source": "a b", "target": "c"},
                                            {"id": 7, "source": "d e", "target": "f"}]), encoding="utf-8")
    # A folder of data files, as datasets.load_dataset reads one; a link to it.
    (d / "mydata").mkdir()
    (d / "mydata" / "test.jsonl").write_text('{"source": "a b", "target": "c"}\n', encoding="utf-8")
    (d / "mydata_link").symlink_to(d / "mydata")
    (d / "scratch" / "data").mkdir(parents=True)
    shutil.copy(d / "mydata" / "test.jsonl", d / "scratch" / "data" / "test.jsonl")


def _write_generation_configs(g: Path) -> None:
    base = g / "copy"
    shutil.copytree(EMBEDDED, base)  # the one copy of the weights: the variants link to its files
    own = json.loads((EMBEDDED / GENERATION_CONFIG).read_text())
    for name, content in {"malformed": b"{not json", "empty": b"", "list": b"[]",
                          "bad_value": json.dumps({**own, "early_stopping": "soon"}).encode(),
                          "watermark": json.dumps({**own, "watermarking_config": 5}).encode(),
                          "dangling": None}.items():
        model_variant(base, g / name, content)


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def names(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("error_paths")
    _write_bad_inputs(root / "inputs")
    _write_generation_configs(root / "generation_configs")
    src, tgt = make_corpus(3, seed=5)
    return {"root": root, "m": EMBEDDED, "d": root / "inputs", "g": root / "generation_configs",
            "ok": write_legacy(root / "ok", src, tgt)}


@pytest.fixture(scope="module")
def runs(names) -> tuple[dict[str, tuple[subprocess.CompletedProcess, Path]], list[str], list[str]]:
    """Every case's run, and what the folder of bad inputs held before and after them all."""
    before = _tree(names["d"])
    found = launch_all(CASES, names)
    return found, before, _tree(names["d"])


@pytest.mark.parametrize("case_id, args, exit_code, fragments", CASES)
def test_refused_in_one_line_before_any_work(runs, names, case_id, args, exit_code, fragments):
    proc, save = runs[0][case_id]
    assert_refused(proc, save, exit_code, [f.format(**names) for f in fragments])


def test_no_refusal_wrote_into_or_removed_from_the_inputs(runs):
    """The dataset folders above all: a --save_dir or --tmp_dir inside one was never made."""
    _, before, after = runs
    assert after == before


@pytest.mark.parametrize("save_dir", ["mydata_out", "mydata2", "elsewhere/mydata"])
def test_outputs_beside_a_dataset_folder_are_accepted(tmp_path, save_dir):
    """check_apart compares whole path components: a name that merely starts like the dataset
    folder's, or a folder of the same name elsewhere, is apart from it."""
    (tmp_path / "mydata").mkdir()
    cfg = EvalConfig(dataset=str(tmp_path / "mydata"), save_dir=str(tmp_path / save_dir))
    check_apart(cfg)  # raises OutputError if not apart
    with pytest.raises(OutputError, match="is inside the --dataset folder"):
        check_apart(EvalConfig(dataset=str(tmp_path / "mydata"), save_dir=str(tmp_path / save_dir),
                               tmp_dir=str(tmp_path / "mydata" / "tmp")))


# ---------------------------------------------------------------- converted CTranslate2 folders
# {e}: folders converted from the embedded model (encoder-decoder), each with another model.bin;
# {v}: folders converted from the embedded decoder-only model, each with another vocabulary (ok:
# its own); {c}: that decoder-only model, which --tokenizer_name names (its config and generation
# settings); {t}: the same with a malformed generation_config.json.

LFS_POINTER = (b"version https://git-lfs.github.com/spec/v1\n"
               b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 3154925\n")
NOT_A_MODEL_FILE = "{e}/{name}/model.bin: not a CTranslate2 model file"
DECODER = ["--engine", "ctranslate2", "--tokenizer_name", "{c}", "--max_new_tokens", "8"]
CT2_CASES = [
    case("ct2-model-bin-empty", ["--engine", "ctranslate2", "--model_name", "{e}/empty"], 1,
         [NOT_A_MODEL_FILE.replace("{name}", "empty")]),
    # a converted model.bin cut short in its header
    case("ct2-model-bin-truncated", ["--engine", "ctranslate2", "--model_name", "{e}/truncated"], 1,
         [NOT_A_MODEL_FILE.replace("{name}", "truncated")]),
    # what `git clone` of a converted model's repository leaves without git-lfs
    case("ct2-model-bin-git-lfs-pointer", ["--engine", "ctranslate2", "--model_name", "{e}/lfs"], 1,
         [NOT_A_MODEL_FILE.replace("{name}", "lfs")]),
    case("ct2-model-bin-pytorch-checkpoint", ["--engine", "ctranslate2", "--model_name", "{e}/torch"], 1,
         [NOT_A_MODEL_FILE.replace("{name}", "torch")]),
    # a decoder-only folder's vocabulary (engines/ct2_generator.py vocabulary)
    case("ct2-vocabulary-malformed", [*DECODER, "--model_name", "{v}/malformed"], 1,
         ["{v}/malformed: cannot read the converted model's vocabulary (Expecting value: line 1",
          "expected vocabulary.json or vocabulary.txt"]),
    case("ct2-vocabulary-not-a-list-of-strings", [*DECODER, "--model_name", "{v}/null"], 1,
         ["{v}/null/vocabulary.json: expected a JSON list of tokens"]),
    case("ct2-vocabulary-missing", [*DECODER, "--model_name", "{v}/missing"], 1,
         ["{v}/missing: cannot read the converted model's vocabulary ([Errno 2] No such file or directory",
          "expected vocabulary.json or vocabulary.txt"]),
    case("ct2-vocabulary-not-a-list-of-strings-dry-run", [*DECODER, "--model_name", "{v}/null", "--dry_run"], 1,
         ["{v}/null/vocabulary.json: expected a JSON list of tokens"]),
    # model_generation_config reached through --tokenizer_name (model/converted.py)
    case("ct2-tokenizer-name-generation-config-malformed",
         ["--engine", "ctranslate2", "--tokenizer_name", "{t}", "--max_new_tokens", "8", "--model_name", "{v}/ok"], 1,
         ["{t}/generation_config.json: not a readable generation config"]),
]


@pytest.fixture(scope="module")
def ct2_names(names) -> dict[str, Path]:
    pytest.importorskip("ctranslate2")
    import torch

    from seq2seq_eval.engines.ct2_convert import converted_model

    root = names["root"] / "ct2"
    encoder = converted_model(str(EMBEDDED), 120)  # into the test session's cache (conftest)
    decoder = converted_model(str(CAUSAL), 120)
    checkpoint = io.BytesIO()
    torch.save({"weight": torch.zeros(4)}, checkpoint)
    header = (encoder / "model.bin").read_bytes()[:5]
    model_bins = {"empty": b"", "truncated": header, "lfs": LFS_POINTER, "torch": checkpoint.getvalue()}
    for name, content in model_bins.items():
        folder = root / "e" / name
        shutil.copytree(encoder, folder)
        for f in ("tokenizer.json", "tokenizer_config.json"):  # as ct2-transformers-converter --copy_files leaves them
            shutil.copy(EMBEDDED / f, folder / f)
        (folder / "model.bin").write_bytes(content)
    for name in ("ok", "malformed", "null", "missing"):
        shutil.copytree(decoder, root / "v" / name)
    (root / "v" / "malformed" / "vocabulary.json").write_bytes(b'["<s>", ')
    (root / "v" / "null" / "vocabulary.json").write_bytes(b'["<s>", null]')
    (root / "v" / "missing" / "vocabulary.json").unlink()
    return {**names, "e": root / "e", "v": root / "v", "c": CAUSAL,
            "t": model_variant(CAUSAL, root / "causal_malformed_generation_config", b"{not json")}


@pytest.fixture(scope="module")
def ct2_runs(ct2_names) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    return launch_all(CT2_CASES, ct2_names)


@pytest.mark.parametrize("case_id, args, exit_code, fragments", CT2_CASES)
def test_converted_folders_refused_in_one_line_before_any_work(ct2_runs, ct2_names, case_id, args, exit_code,
                                                               fragments):
    pytest.importorskip("ctranslate2")
    proc, save = ct2_runs[case_id]
    assert_refused(proc, save, exit_code, [f.format(**ct2_names) for f in fragments])


# ---------------------------------------------------------------- a publish's recovery (outputs/publish.py)


def visible(folder: Path) -> dict[str, bytes]:
    """The files a reader sees in the folder (not the tool's bookkeeping)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name not in (RECORD, INTENT)}


def publish_set(folder: Path, generations: bytes) -> dict[str, bytes]:
    """A run's publish as write_outputs makes it: the generations, then the completion file."""
    staging = Staging(folder, "test", "output")
    staging.add("test_generations.txt", generations)
    staging.publish(("test_bleu.json", lambda removed: b'{"bleu": 1.0}\n'), stale=True)
    return visible(folder)


@pytest.fixture
def said(caplog):
    """The package logger's messages so far, whatever its propagation (the command line turns it off)."""
    logger = logging.getLogger("seq2seq_eval")
    logger.addHandler(caplog.handler)
    yield lambda: caplog.messages
    logger.removeHandler(caplog.handler)


def test_a_source_changed_while_copied_across_filesystems_is_refused_and_nothing_published(tmp_path, monkeypatch):
    """The shared tail's assembled file, on another filesystem than --save_dir, is copied into the
    staging folder and hashed as it is copied; a rank still writing into it meanwhile changes
    bytes not yet copied: refused in one line, and the earlier set stays as it was."""
    folder = tmp_path / "out"
    earlier = publish_set(folder, b"earlier\n")
    source = tmp_path / "assembled"
    data = bytes(range(256)) * 64
    source.write_bytes(data)
    size, known = len(data), digest.file_digest(source)
    real_rename, real_write = os.rename, publish.StagedFile.write

    def rename(src, dst, *args, **kwargs):
        if Path(src) == source:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_rename(src, dst, *args, **kwargs)

    def write(self, block):
        real_write(self, block)
        with open(source, "r+b") as f:  # the last bytes, after the first block was copied
            f.seek(size - 10)
            f.write(b"X" * 10)

    monkeypatch.setattr(publish, "COPY_BYTES", 4096)
    monkeypatch.setattr(publish.os, "rename", rename)
    monkeypatch.setattr(publish.StagedFile, "write", write)
    staging = Staging(folder, "test", "output")
    with pytest.raises(OutputError) as e:
        staging.adopt("test_generations.txt", source, size, known)
    staging.discard()  # as write_outputs does with any error
    assert str(e.value) == (f"{source}: changed while it was copied into {folder}; expected the assembled outputs "
                            "left alone until the run ends")
    assert visible(folder) == earlier
    assert not (folder / STAGING).exists() and not (folder / INTENT).exists()


def test_a_file_put_where_the_publish_moved_the_tools_own_aside_is_kept_and_the_publish_undone(tmp_path, monkeypatch,
                                                                                                 said):
    """Between the publish moving the earlier completion file aside and renaming the new one into
    place, someone puts a file of theirs at that name: the publish stops in one line, its
    recovery undoes it (the earlier generations back in place) and keeps both completion files:
    theirs where they put it, the tool's in the staging folder, named in a warning. The record
    does not take theirs for the tool's, so no later run writes over it."""
    folder = tmp_path / "out"
    earlier = publish_set(folder, b"earlier\n")
    theirs = b"someone's own\n"
    real_rename = os.rename

    def rename(src, dst, *args, **kwargs):
        done = real_rename(src, dst, *args, **kwargs)
        if Path(src) == folder / "test_bleu.json":  # the tool's completion file just moved aside
            (folder / "test_bleu.json").write_bytes(theirs)
        return done

    monkeypatch.setattr(publish.os, "rename", rename)
    with pytest.raises(OutputError) as e:
        publish_set(folder, b"new\n")
    monkeypatch.undo()
    assert str(e.value) == (f"{folder}: putting the outputs in place failed ({folder}/test_bleu.json: appeared after "
                            "the publish moved the tool's file aside; expected nothing there until the new file is "
                            "renamed into place); undone: it holds what it held before; fix the cause, then run the "
                            "command again")
    assert visible(folder) == {**earlier, "test_bleu.json": theirs}
    kept = list((folder / STAGING).glob("*/old/test_bleu.json"))
    assert len(kept) == 1 and kept[0].read_bytes() == earlier["test_bleu.json"]
    assert (f"{folder}/test_bleu.json: taken since a publish moved the tool's file aside; that file is kept as "
            f"{kept[0]}") in said()
    assert not (folder / INTENT).exists()
    assert not OutputRecord(folder).owns(folder / "test_bleu.json")
    assert OutputRecord(folder).owns(folder / "test_generations.txt")


@pytest.mark.parametrize("step", ["apply_all", "commit_record", "remove_staged"])
def test_a_publish_that_fails_after_its_intent_says_truly_what_became_of_it(tmp_path, monkeypatch, caplog, step):
    """An I/O error inside the publish once its intent is written: in the moves into place
    (apply_all) or while the record is written (commit_record), the publish is undone at once,
    under the same locks (the earlier set back, its record as it was) and one OutputError says so;
    after every folder holds the new files and record (the staging folder's removal,
    remove_staged, the last step), the publish is whole: a warning, no error, and the leftovers
    are the next command's to remove."""
    folder = tmp_path / "out"
    earlier = publish_set(folder, b"earlier\n")
    record_before = (folder / RECORD).read_bytes()
    module = publish if step != "remove_staged" else intent
    real = getattr(module, step)
    calls = []

    def failing(*args, **kwargs):
        if not calls:  # the publish's own call; recovery's calls go through
            calls.append(1)
            if step != "remove_staged":
                real(*args, **kwargs) if step == "commit_record" else None
                raise OSError(errno.EIO, "Input/output error")
            raise OSError(errno.EIO, "Input/output error")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, step, failing)
    staging = Staging(folder, "test", "output")
    staging.add("test_generations.txt", b"later\n")
    later = {"test_bleu.json": b'{"bleu": 2.0}\n', "test_generations.txt": b"later\n"}
    if step == "remove_staged":
        with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
            staging.publish(("test_bleu.json", lambda removed: later["test_bleu.json"]), stale=True)
        assert f"{folder}: the outputs are published; removing what the publish had moved aside failed" in caplog.text
        assert visible(folder) == later
        monkeypatch.undo()
        publish.recover(folder)  # what the next command does first
        assert not (folder / STAGING).exists()
    else:
        with pytest.raises(OutputError) as e:
            staging.publish(("test_bleu.json", lambda removed: later["test_bleu.json"]), stale=True)
        assert str(e.value) == (f"{folder}: putting the outputs in place failed (Input/output error); undone: it holds "
                                "what it held before; fix the cause, then run the command again")
        assert visible(folder) == earlier
        assert (folder / RECORD).read_bytes() == record_before
    assert not (folder / INTENT).exists() and not (folder / STAGING).exists()
    assert all(OutputRecord(folder).owns(folder / name) for name in visible(folder))


# The command line, with the first rename onto sys.argv[1] failing as a disk does (EIO).
FAILING_MOVE = '''
import errno, os, sys
target, argv = [os.path.abspath(sys.argv[1])], sys.argv[2:]
real = os.rename
def rename(src, dst, *args, **kwargs):
    if target and os.path.abspath(dst) == target[0]:
        target.clear()
        raise OSError(errno.EIO, "Input/output error", str(dst))
    return real(src, dst, *args, **kwargs)
os.rename = rename
from seq2seq_eval.cli import main
sys.exit(main(argv))
'''


def test_a_move_into_place_that_fails_is_one_line_and_leaves_one_complete_set(names, tmp_path):
    script = tmp_path / "failing_move.py"
    script.write_text(FAILING_MOVE, encoding="utf-8")
    save = tmp_path / "out"
    proc = single([str(save / "test_generations.txt"), "--model_name", str(EMBEDDED), "--data_dir", str(names["ok"]),
                   "--bs", "4", "--save_dir", str(save)], cwd=tmp_path, script=script)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith(PREFIX)]
    assert len(errors) == 1 and str(save) in errors[0], proc.stderr[-3000:]
    assert not (save / INTENT).exists() and not (save / STAGING).exists()
    assert all(OutputRecord(save).owns(save / name) for name in visible(save))
