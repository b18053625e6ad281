"""Nothing the user owns is written over or deleted (issue: what the tool writes and removes).

Each data-loss test snapshots every file under its folder (bytes) before and after, so that a
file changed, removed or added anywhere shows, not only the one the test is about.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, assert_ok, make_corpus, single, write_legacy

PREFIX = "seq2seq_eval: error: "


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith(PREFIX), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0][len(PREFIX):]


@pytest.fixture(scope="module")
def case(tiny_model, tmp_path_factory):
    """A model folder of its own (its files are inputs), data with an extra reference set, and
    an earlier run for --compare_to."""
    root = tmp_path_factory.mktemp("paths")
    model = root / "model"
    shutil.copytree(tiny_model, model)
    src, tgt = make_corpus(6, seed=31)
    data = write_legacy(root / "data", src, tgt)
    (data / "test.target.1").write_text("".join(t + " ." + "\n" for t in tgt), encoding="utf-8")
    base = root / "base"
    assert_ok(single(["--model_name", str(model), "--data_dir", str(data), "--save_dir", str(base), "--bs", "3"], cwd=root))
    return root, model, data, base


def _run_all(commands: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda argv: single(argv, cwd=cwd, timeout=180), commands))


def test_no_output_flag_can_be_pointed_at_an_input(case):
    """Property: every output the user names (the legacy SAVE_PATH and --score_path, --save_dir,
    --tmp_dir, compare's --report), and the outputs a run names itself inside --save_dir, pointed
    at each input (source, target, an extra reference set, a model file, a --compare_to file):
    refused in one line before any work, in the dry run too, and every file byte-identical."""
    root, model, data, base = case
    inputs = {"source": data / "test.source", "target": data / "test.target", "extra reference": data / "test.target.1",
              "model file": model / "config.json", "compare_to file": base / "test_generations.txt"}
    project = ["--model_name", str(model), "--data_dir", str(data), "--compare_to", str(base), "--bs", "3"]
    legacy_inputs = {k: v for k, v in inputs.items() if k != "extra reference"}  # the legacy form reads one reference set
    commands: dict[str, list[str]] = {}
    for what, path in legacy_inputs.items():
        legacy = [str(model), str(data / "test.source"), str(root / "gen.txt"), "--reference_path",
                  str(data / "test.target"), "--compare_to", str(base), "--task", "translation"]
        commands[f"SAVE_PATH = {what}"] = [str(model), str(data / "test.source"), str(path), *legacy[3:]]
        commands[f"--score_path = {what}"] = [*legacy, "--score_path", str(path)]
    for what, path in inputs.items():
        commands[f"--save_dir = {what}"] = [*project, "--save_dir", str(path)]
        commands[f"--tmp_dir = {what}"] = [*project, "--save_dir", str(root / "out"), "--tmp_dir", str(path)]
        commands[f"--report = {what}"] = ["compare", "--predictions", str(base), str(base / "test_generations.txt"),
                                          "--references", str(data / "test.target"), str(data / "test.target.1"),
                                          "--sources", str(data / "test.source"), "--names", "a", "b",
                                          "--report", str(path)]
    # The outputs the run names itself, onto inputs of the same name.
    commands["--save_dir = --compare_to"] = [*project, "--save_dir", str(base)]
    commands["--tmp_dir = the data folder"] = [*project, "--save_dir", str(root / "out"), "--tmp_dir", str(data)]
    named = root / "named"
    named.mkdir()
    shutil.copy(data / "test.source", named / "test_generations.txt")
    commands["output named like the sources"] = ["--model_name", str(model), "--input_path",
                                                 str(named / "test_generations.txt"), "--save_dir", str(named)]
    dry = {f"{k} (dry run)": v + ["--dry_run"] for k, v in commands.items() if v[0] != "compare"}
    table = {**commands, **dry}
    before = snapshot(root)
    results = dict(zip(table, _run_all(list(table.values()), root)))
    for name, proc in results.items():
        line = one_line(proc)
        assert any(why in line for why in ("would write over", "is a file", "but no .seq2seq_eval_tmp marker",
                                           "exists and seq2seq_eval did not write it")), f"{name}: {line}"
        assert "rank 0:" not in proc.stderr, f"{name}: generation started"
    assert snapshot(root) == before
    assert not (root / "out").exists() and not (root / "out_tmp").exists()
    # Each refusal names the input it protects.
    assert "would write over the sources (INPUT_PATH, --input_path)" in one_line(results["SAVE_PATH = source"])
    assert "would write over the references (--reference_path)" in one_line(results["--score_path = target"])
    assert "would write over --compare_to file test_generations.txt" in one_line(results["--save_dir = --compare_to"])
    assert "--report would write over --predictions" in one_line(results["--report = compare_to file"])
    assert "would write over --model_name file config.json" in one_line(results["SAVE_PATH = model file"])


def test_legacy_save_path_and_score_path_cannot_be_one_file(case):
    root, model, data, _ = case
    out = root / "same.txt"
    proc = single([str(model), str(data / "test.source"), str(out), "--reference_path", str(data / "test.target"),
                   "--score_path", str(out)], cwd=root)
    assert one_line(proc) == f"{out}: both SAVE_PATH (the generations) and --score_path (the scores); " \
                             "expected a separate file for each"
    assert not out.exists()


def test_stale_cleanup_never_removes_an_input(tmp_path):
    """Results of an earlier run that this run does not write are removed only when the tool
    wrote them, and never when this run reads them: distillation's next step reads the
    pseudolabels (or the .pseudo.target) from the folder it writes into. (The embedded model,
    whose pseudolabels are text: the tiny one's may be empty, which is no reference.)"""
    lines = {ext: (REPO / "data_samples" / "translation" / f"test.{ext}").read_text(encoding="utf-8").splitlines()[:6]
             for ext in ("source", "target")}
    data = write_legacy(tmp_path / "data", lines["source"], lines["target"])
    pseudo = ["--data_dir", str(data), "--num_return_sequences", "2", "--num_beams", "2", "--pseudo_target"]
    for name, reads in (("test_pseudolabels.jsonl", lambda out: ["--data_dir", str(out / "test_pseudolabels.jsonl")]),
                        ("test.pseudo.target", lambda out: ["--input_path", str(data / "test.source"),
                                                             "--reference_path", str(out / "test.pseudo.target")])):
        out = tmp_path / name
        common = ["--bs", "3", "--save_dir", str(out)]
        assert_ok(single([*common, *pseudo], cwd=tmp_path))
        kept = (out / name).read_bytes()
        assert_ok(single([*common, *reads(out)], cwd=tmp_path))
        assert (out / name).read_bytes() == kept
        # The pseudolabel run's other results, which this run neither writes nor reads, went.
        others = {"test_pseudolabels.jsonl", "test.pseudo.target", "test_run_info.json"} - {name}
        assert not any((out / other).exists() for other in others), sorted(p.name for p in out.iterdir())


def test_a_users_file_in_save_dir_is_neither_written_over_nor_removed(case, tmp_path):
    _, model, data, _ = case
    out = tmp_path / "out"
    out.mkdir()
    (out / "test_bleu.json").write_text("my notes\n")
    (out / "test_run_info.json").write_text("mine too\n")
    before = snapshot(tmp_path)
    common = ["--model_name", str(model), "--data_dir", str(data), "--bs", "3", "--save_dir", str(out)]
    for extra in (["--dry_run"], []):
        line = one_line(single([*common, *extra], cwd=tmp_path))
        assert line.startswith(f"{out / 'test_bleu.json'} (output test_bleu.json of --save_dir): exists and "
                               "seq2seq_eval did not write it (no entry in .seq2seq_eval_outputs.json there)"), line
    assert snapshot(tmp_path) == before
    # A pseudolabel run does not write test_bleu.json: it would have been "stale", but is the user's.
    (out / "test_run_info.json").unlink()
    assert_ok(single([*common, "--num_return_sequences", "2", "--num_beams", "2"], cwd=tmp_path))
    assert (out / "test_bleu.json").read_text() == "my notes\n"
    # A file the tool wrote and the user changed since is the user's too.
    gen = out / "test_generations.txt"
    gen.write_text(gen.read_text() + "edited\n")
    line = one_line(single([*common, "--num_return_sequences", "2", "--num_beams", "2"], cwd=tmp_path))
    assert ("test_generations.txt (output test_generations.txt of --save_dir): is not the file seq2seq_eval wrote here "
            "(its bytes differ from those in .seq2seq_eval_outputs.json)") in line


def test_the_temp_dir_is_the_tools_own(case, tmp_path):
    root, model, data, _ = case
    common = ["--model_name", str(model), "--data_dir", str(data), "--bs", "3"]
    # A folder of the user's: refused, untouched, whatever it holds.
    mine = tmp_path / "mine"
    (mine / "cache").mkdir(parents=True)
    (mine / "cache" / "notes.txt").write_text("keep\n")
    (mine / ".draft.tmp").write_text("keep\n")
    (mine / "manifest.json").write_text('{"my": "manifest"}\n')
    before = snapshot(tmp_path)
    for extra in (["--dry_run"], []):
        line = one_line(single([*common, "--save_dir", str(tmp_path / "out"), "--tmp_dir", str(mine), *extra], cwd=tmp_path))
        assert line.startswith(f"--tmp_dir {mine}: holds files (manifest.json (not a seq2seq_eval manifest), "
                               ".draft.tmp, cache/notes.txt) but no .seq2seq_eval_tmp marker"), line
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()
    # An empty folder of the user's is used and left as it was: empty, still there.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_ok(single([*common, "--save_dir", str(tmp_path / "o1"), "--tmp_dir", str(empty)], cwd=tmp_path))
    assert empty.is_dir() and list(empty.iterdir()) == []
    # A missing one, several levels deep: made, then removed with the folders made for it.
    assert_ok(single([*common, "--save_dir", str(tmp_path / "o2"), "--tmp_dir", str(tmp_path / "a" / "b" / "t")],
                     cwd=tmp_path))
    assert not (tmp_path / "a").exists()
    # The default one beside --save_dir: nothing left (no run.lock either).
    assert_ok(single([*common, "--save_dir", str(tmp_path / "o3")], cwd=tmp_path))
    assert not (tmp_path / "o3_tmp").exists()


def test_a_file_the_user_adds_to_the_temp_dir_survives_cleanup(case, tmp_path):
    _, model, data, _ = case
    save = tmp_path / "out"
    args = ["--model_name", str(model), "--data_dir", str(data), "--bs", "3", "--save_dir", str(save)]
    assert_ok(single([*args, "--debug"], cwd=tmp_path))  # --debug keeps the temp dir
    tmp = Path(f"{save}_tmp")
    (tmp / "cache" / "notes.txt").write_text("keep\n")
    (tmp / "mine.txt").write_text("keep\n")
    assert_ok(single([*args, "--resume"], cwd=tmp_path))
    assert sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")) == ["cache", "cache/notes.txt", "mine.txt"]


def test_a_run_that_journaled_nothing_does_not_block_the_next(case, tmp_path):
    root, model, data, _ = case
    broken = tmp_path / "model"
    shutil.copytree(model, broken)
    weights = broken / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    save = tmp_path / "out"
    args = ["--model_name", str(broken), "--data_dir", str(data), "--bs", "3", "--save_dir", str(save)]
    proc = single(args, cwd=tmp_path)
    assert proc.returncode != 0
    assert not Path(f"{save}_tmp").exists()  # it made the temp dir, found nothing to keep, removed it
    weights.write_bytes(good)
    assert_ok(single(args, cwd=tmp_path))
    # A run killed before its first batch was journaled cannot clean up: its temp dir (manifest,
    # caches, an empty journal) is taken over by the next plain run, and by --resume.
    assert_ok(single([*args, "--debug"], cwd=tmp_path))
    tmp = Path(f"{save}_tmp")
    for journal in tmp.glob("journal_rank_*.jsonl"):
        journal.write_bytes(b"")
    reference = (save / "test_generations.txt").read_bytes()
    assert_ok(single(args, cwd=tmp_path))
    assert (save / "test_generations.txt").read_bytes() == reference and not tmp.exists()


def test_type_path_and_split_stay_inside_save_dir(case, tmp_path):
    _, model, data, _ = case
    (tmp_path / "data").mkdir()
    shutil.copy(data / "test.source", tmp_path / "data" / "x.source")
    shutil.copy(data / "test.target", tmp_path / "data" / "x.target")
    before = snapshot(tmp_path)
    for flag, value in (("--type_path", "../x"), ("--type_path", "sub/x"), ("--split", "a/b")):
        extra = ["--dataset", str(tmp_path / "data" / "x.source")] if flag == "--split" else \
            ["--data_dir", str(tmp_path / "data" / "sub")]
        for dry in (["--dry_run"], []):
            line = one_line(single(["--model_name", str(model), *extra, flag, value,
                                    "--save_dir", str(tmp_path / "data" / "sub" / "out"), *dry], cwd=tmp_path))
            assert line.startswith(f"{flag} {value!r}: output files are named after it, so it must be a plain name"), line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("flag", ["--save_dir", "--tmp_dir"])
def test_a_folder_that_takes_no_file_fails_the_dry_run(case, tmp_path, flag):
    if not os.path.ismount("/sys") or os.access("/sys", os.W_OK) and _sys_takes_folders():
        pytest.skip("needs a /sys that refuses new folders")
    _, model, data, _ = case
    line = one_line(single(["--model_name", str(model), "--data_dir", str(data), flag, "/sys/x", "--dry_run"],
                           cwd=tmp_path))
    assert line.startswith(f"{flag} /sys/x: cannot create /sys/x ("), line


def _sys_takes_folders() -> bool:
    try:
        os.mkdir("/sys/s2s_probe")
    except OSError:
        return False
    os.rmdir("/sys/s2s_probe")
    return True


def test_a_plain_text_file_as_data_dir_says_so(case, tmp_path):
    _, model, data, _ = case
    line = one_line(single(["--model_name", str(model), "--data_dir", str(data / "test.target.1"), "--dry_run"],
                           cwd=tmp_path))
    assert line == (f"--data_dir {data / 'test.target.1'}: a file whose first line is not a JSON object; expected the "
                    "folder that holds test.source and test.target, or a JSON Lines file (.jsonl) with one object per "
                    "line (for one source per line, use --input_path)")


def test_report_replaces_only_an_earlier_report(case, tmp_path):
    root, _, data, base = case
    argv = ["compare", "--predictions", str(base), str(base / "test_generations.txt"), "--names", "a", "b"]
    notes = tmp_path / "notes.html"
    notes.write_text("<p>mine</p>\n")
    line = one_line(single([*argv, "--report", str(notes)], cwd=tmp_path))
    assert line == (f"{notes} (--report): exists and seq2seq_eval did not write it (no entry in "
                    ".seq2seq_eval_outputs.json there); move it away or name another file: the tool writes over only "
                    "its own earlier outputs")
    assert notes.read_text() == "<p>mine</p>\n"
    report = tmp_path / "sub" / "report.html"
    assert_ok(single([*argv, "--report", str(report)], cwd=tmp_path))
    first = report.read_bytes()
    assert_ok(single([*argv, "--report", str(report)], cwd=tmp_path))
    assert report.read_bytes() == first


def test_help_names_both_subcommands_and_the_legacy_form(tmp_path):
    proc = single(["--help"], cwd=tmp_path)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0
    assert "seq2seq_eval score --task" in text and "seq2seq_eval compare --predictions" in text
    assert "seq2seq_eval MODEL INPUT_PATH SAVE_PATH" in text
