"""`select` on the ranks (selection/ranks.py): batches of the candidates file dealt, claimed and
journaled as a run's, the same bytes at 1, 2 and 3 processes, resumed after a SIGKILL, and the
temp dir under the tool's rules (refused when not its own, removed after)."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest
from conftest import assert_ok, kill_rank_after_first_line, run_ranks, single

from seq2seq_eval.cli import main
from seq2seq_eval.selection.command import selection_lines
from seq2seq_eval.selection.ranks import PER_BATCH

DATA = Path(__file__).resolve().parent / "data" / "selection"
WORDS = "the a cat dog sat ran on under mat house red blue small big".split()


def synthetic(path: Path, n: int, k: int, seed: int) -> Path:
    """n examples of k short candidates, ids unique, with repeats (as sampled candidates have)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            pool = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(k - 1)]
            cands = pool + [rng.choice(pool)]
            f.write(json.dumps({"id": f"ex{i}", "source": f"source {i}", "candidates": cands}) + "\n")
    return path


def beam_like(path: Path, copies: int) -> Path:
    """The embedded model's beam candidates (8 each), repeated under new ids: a slower utility."""
    records = [json.loads(line) for line in (DATA / "beam8.jsonl").read_text(encoding="utf-8").splitlines()]
    with open(path, "w", encoding="utf-8") as f:
        for c in range(copies):
            for r in records:
                f.write(json.dumps({"id": f"{c}-{r['id']}", "source": r["source"], "candidates": r["candidates"]}) + "\n")
    return path


def expected(path: Path, metric: str = "chrf") -> str:
    """One process, no temp dir: the selections streamed as the command prints them."""
    return "".join(line + "\n" for line in selection_lines(path, "mbr", metric))


def select_args(path: Path, *more: str, metric: str = "chrf") -> list[str]:
    return ["select", "--candidates", str(path), "--select", "mbr", "--select_metric", metric, *more]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("select_ranks")
    path = synthetic(root / "cands.jsonl", 7 * PER_BATCH - 5, 4, seed=5)  # 7 batches, the last one short
    return path, {metric: expected(path, metric) for metric in ("chrf", "bleu")}


@pytest.mark.parametrize("n, threads", [(1, 2), (2, 2), (3, 1)])
def test_the_same_bytes_at_1_2_and_3_processes(small, tmp_path, n, threads):
    """Published (--output, chrF) and printed (--tmp_dir, BLEU), at any number of ranks and torch
    threads per rank (OMP_NUM_THREADS): the bytes of the one single-threaded process that streams
    them; the temp dirs removed after; rank 0 alone prints."""
    path, want = small
    env = {"OMP_NUM_THREADS": str(threads)}
    launch = ((lambda a: single(a, cwd=tmp_path, env=env)) if n == 1
              else (lambda a: run_ranks(n, a, cwd=tmp_path, env=env)))
    out = tmp_path / "sel.jsonl"
    proc = launch(select_args(path, "--output", str(out)))
    assert_ok(proc)
    assert out.read_text(encoding="utf-8") == want["chrf"]
    assert proc.stdout == f"wrote {want['chrf'].count(chr(10))} selections to {out}\n"
    proc = launch(select_args(path, "--tmp_dir", str(tmp_path / "work"), metric="bleu"))
    assert_ok(proc)
    assert proc.stdout == want["bleu"]
    assert sorted(os.listdir(tmp_path)) == [".seq2seq_eval_outputs.json", "sel.jsonl"]


def _journaled(tmp: Path) -> list[int]:
    return sorted(json.loads(line)["batch"] for p in tmp.glob("journal_rank_*.jsonl")
                  for line in p.read_text(encoding="utf-8").splitlines())


def test_a_killed_rank_resumes_to_the_same_bytes(tmp_path):
    """Rank 1 SIGKILLed after journaling its first batch (the launcher stops rank 0 with it): the
    next command without --resume refuses the temp dir; with it, at another world size, only the
    batches no journal holds are selected, each once, and the output is the one process's bytes."""
    # 400 examples of 8 candidates: 13 batches, so that rank 1 still holds its journal when it is
    # found (with 3 batches the ranks could finish between two looks at /proc). BLEU, sacrebleu's
    # per-pair loop: chrF's matrix selects a batch in milliseconds, faster than the looks.
    path = beam_like(tmp_path / "beam.jsonl", 40)
    out, tmp = tmp_path / "sel.jsonl", tmp_path / "sel.jsonl_tmp"
    args = select_args(path, "--output", str(out), metric="bleu")
    result = kill_rank_after_first_line(args, tmp / "journal_rank_1.jsonl", tmp_path, timeout=60)
    assert result is not None and result.returncode != 0
    before = _journaled(tmp)
    assert 0 < len(before) < 13 and len(set(before)) == len(before)
    assert not out.exists()
    refused = run_ranks(2, args, cwd=tmp_path)
    assert refused.returncode != 0 and "pass --resume to continue it" in refused.stderr
    assert_ok(run_ranks(3, args + ["--resume"], cwd=tmp_path))
    assert out.read_text(encoding="utf-8") == expected(path, "bleu")
    assert not tmp.exists()


def test_resume_after_a_kill_in_one_process(tmp_path):
    """One process killed mid-selection, resumed. Killed by the instrumentation (tests/fsfaults.py)
    as it starts its second journal write, after its first batch is journaled: a watcher polling
    the journal would race a selection that takes milliseconds a batch."""
    from faultloop import command

    path = beam_like(tmp_path / "beam.jsonl", 4)  # 40 examples: 2 batches
    out, tmp = tmp_path / "sel.jsonl", tmp_path / "work"
    args = select_args(path, "--tmp_dir", str(tmp))
    killed = command(tmp_path, args, tmp_path / "kill.log", plan={"at_match": ["write", "journal_rank_0.jsonl", 2],
                                                                  "fault": "kill"})
    assert killed.code == -signal.SIGKILL and killed.fault_op is not None, killed.err
    assert _journaled(tmp) == [0]
    # The journals belong to the file's bytes and the selection: another file, or another
    # utility, is refused, the journals kept.
    changed = tmp_path / "changed.jsonl"
    changed.write_bytes(path.read_bytes().replace(b'"0-', b'"x-', 1))
    for other in (select_args(changed, "--tmp_dir", str(tmp), "--resume"),
                  select_args(path, "--tmp_dir", str(tmp), "--resume", metric="bleu")):
        refused = single(other, cwd=tmp_path)
        assert refused.returncode != 0 and f"--resume: {tmp} belongs to a run with different" in refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
    resumed = single([*args, "--resume"], cwd=tmp_path)
    assert_ok(resumed)
    assert resumed.stdout == expected(path)
    assert not tmp.exists() and not out.exists()


def test_a_kill_once_the_output_is_published_leaves_no_run_to_resume(small, tmp_path):
    """--output in place, then a kill before the temp dir is cleared: right after the publish's
    intent is gone, and at the first step in the temp dir after it. The temp dir is marked
    published inside the publish (a run's rule), so the same command again is not refused as
    an unfinished selection to --resume: it clears the temp dir and leaves the same output.
    (tests/fsfaults.py numbers the steps; the whole loop is scripts/fault_loop.py's select kinds.)"""
    import shutil

    from faultloop import command

    path, want = small[0], small[1]["chrf"]
    root = tmp_path / "r"
    root.mkdir()
    out = root / "o" / "sel.jsonl"
    args = select_args(path, "--output", str(out))
    whole = command(root, args, tmp_path / "count.log")
    assert whole.code == 0, whole.err
    gone = next(n for n, kind, where in whole.ops if kind == "unlink" and where.endswith(".seq2seq_eval_publish.json"))
    in_tmp = next(n for n, _, where in whole.ops if n > gone and "sel.jsonl_tmp" in where)
    for n in (gone + 1, in_tmp):
        shutil.rmtree(root)
        root.mkdir()
        killed = command(root, args, tmp_path / "kill.log", plan={"at": n, "fault": "kill"})
        assert killed.code == -signal.SIGKILL and out.read_text(encoding="utf-8") == want
        again = single(args, cwd=tmp_path)
        assert_ok(again)
        assert out.read_text(encoding="utf-8") == want and not Path(f"{out}_tmp").exists()


def test_a_fault_cleaning_up_a_completed_publish_is_a_warning(small, tmp_path):
    """--output's publish killed past its commit point; the next command completes it, then a
    step of removing what it had moved aside fails (EPERM on the folder's fsync right after the
    intent is removed: transaction.recover_locked). The publish is complete: a warning, and the
    command goes on to its own selection, instead of a line saying the intent was kept (it was
    gone) and the publish left half done."""
    import shutil

    from faultloop import command

    path, want = small[0], small[1]["chrf"]
    root, start = tmp_path / "r", tmp_path / "start"
    out = root / "o" / "sel.jsonl"
    args = select_args(path, "--output", str(out))
    killed = command(root, args, tmp_path / "kill.log", plan={"at_match": ["rename", "new/sel.jsonl ->", 1], "fault": "kill"})
    assert killed.code < 0 and (root / "o" / ".seq2seq_eval_publish.json").exists()
    shutil.copytree(root, start, symlinks=True)
    counted = command(root, args, tmp_path / "count.log")
    assert counted.code == 0, counted.err
    gone = next(n for n, kind, where in counted.ops if kind == "unlink" and where.endswith(".seq2seq_eval_publish.json"))
    assert counted.ops[gone][1:] == ("fsync", str(root / "o"))  # the op after it (numbered from 1)
    shutil.rmtree(root)
    shutil.copytree(start, root, symlinks=True)
    faulted = command(root, args, tmp_path / "fault.log", plan={"at": gone + 1, "fault": "EPERM"})
    assert faulted.code == 0 and "completing the publish of run" in faulted.err, faulted.err
    assert "removing what it had moved aside failed (Operation not permitted" in faulted.err
    assert out.read_text(encoding="utf-8") == want and not Path(f"{out}_tmp").exists()
    again = single(args, cwd=tmp_path)
    assert_ok(again)
    assert sorted(os.listdir(root / "o")) == [".seq2seq_eval_outputs.json", "sel.jsonl"]


@pytest.mark.parametrize("output", [False, True])
def test_a_signal_once_the_selections_are_out_says_complete(small, tmp_path, output):
    """SIGTERM while the temp dir is removed, the selections published (or every line printed):
    exit 130 and one line saying the selection is complete, the temp dir removed, never told to
    --resume (the run's rule for a signal after its publish)."""
    from faultloop import command

    path, want = small[0], small[1]["chrf"]
    out = tmp_path / "r" / "o" / "sel.jsonl"
    tmp = Path(f"{out}_tmp") if output else tmp_path / "r" / "work"
    args = select_args(path, *(["--output", str(out)] if output else ["--tmp_dir", str(tmp)]))
    stopped = command(tmp_path / "r", args, tmp_path / "term.log",
                      plan={"at_match": ["unlink", "journal_rank_0.jsonl", 1], "fault": "term"})
    lines = [x for x in stopped.err.splitlines() if x.startswith("seq2seq_eval: error:")]
    where = f"the selections were published into {out}" if output else "every selection was printed"
    assert stopped.code == 130 and lines == [f"seq2seq_eval: error: interrupted by SIGTERM after {where}; the selection "
                                             f"is complete ({tmp} removed)"], stopped.err
    assert (out.read_text(encoding="utf-8") if output else stopped.out) == want and not tmp.exists()


@pytest.mark.parametrize("output", [False, True])
def test_a_filesystem_fault_in_its_own_steps_is_one_line(small, tmp_path, output):
    """EPERM in place of a step of its own that has no message of its own (journals, claims, the
    manifest and the marker have theirs): making the temp dir, --tmp_dir's or --output's default.
    One line saying what became of the selection, never a traceback; then the same command
    finishes the selection."""
    from faultloop import command

    path, want = small[0], small[1]["chrf"]
    out = tmp_path / "r" / "o" / "sel.jsonl"
    tmp = Path(f"{out}_tmp") if output else tmp_path / "r" / "work"
    args = select_args(path, *(["--output", str(out)] if output else ["--tmp_dir", str(tmp)]))
    failed = command(tmp_path / "r", args, tmp_path / "fault.log", plan={"at_match": ["mkdir", tmp.name, 1], "fault": "EPERM"})
    assert failed.code == 1 and "Traceback" not in failed.err, failed.err
    lines = [x for x in failed.err.splitlines() if x.startswith("seq2seq_eval: error:")]
    said = "nothing was published" if output else "the selections were not printed"
    assert len(lines) == 1 and lines[0].endswith(f"{tmp}: Operation not permitted; {said}: fix the cause (space, "
                                                 "permissions), then rerun the same command"), failed.err
    again = single(args, cwd=tmp_path)
    assert_ok(again)
    assert (out.read_text(encoding="utf-8") if output else again.stdout) == want and not tmp.exists()


@pytest.mark.parametrize("flags, said", [
    (["--resume"], "select without --output: --resume reads the journals through a temp dir; pass --tmp_dir"),
])
def test_refusals_in_one_line(small, capsys, flags, said):
    path, _ = small
    assert main(select_args(path, *flags)) != 0
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


READER_GONE = """
import os, runpy
if os.environ["RANK"] == "0":  # rank 0 prints into a pipe whose reader has gone (`| head`, closed)
    r, w = os.pipe()
    os.dup2(w, 1)
    os.close(r)
    os.close(w)
runpy.run_module("seq2seq_eval", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_reader_that_stops_reading_ends_it_quietly(small, tmp_path, nproc):
    """`select ... | head`: the reader stops, and the command stops printing without a traceback,
    exits 0 and leaves no temp dir to --resume, on the ranks as in one process."""
    path, _ = small
    script = tmp_path / "reader_gone.py"
    script.write_text(READER_GONE)
    tmp = tmp_path / "work"
    proc = run_ranks(nproc, [*select_args(path, "--tmp_dir", str(tmp))], cwd=tmp_path, script=script)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
    assert not tmp.exists()


def test_under_ranks_a_temp_dir_is_needed(small, tmp_path):
    path, _ = small
    proc = run_ranks(2, select_args(path), cwd=tmp_path)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().endswith("select without --output: under torchrun the ranks share their selections "
                                        "through a temp dir; pass --tmp_dir (a missing or empty folder, or the one "
                                        "the selection to resume used)"), proc.stderr


def test_the_temp_dir_is_not_the_outputs_folder(small, tmp_path, capsys):
    path, _ = small
    assert main(select_args(path, "--output", str(tmp_path / "o.jsonl"), "--tmp_dir", str(tmp_path))) != 0
    assert "holds --output" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_folder_of_someone_elses_is_not_taken(small, tmp_path, capsys):
    path, _ = small
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    assert main(select_args(path, "--tmp_dir", str(theirs))) != 0
    assert "no .seq2seq_eval_tmp marker" in capsys.readouterr().err
    assert os.listdir(theirs) == ["notes.txt"]


@pytest.mark.parametrize("at", [1, 5, 9])
def test_a_repeated_id_is_found_across_the_id_blocks(tmp_path, monkeypatch, at):
    """Ids are checked by 8-byte hashes in sorted blocks (inputs/seen.py), as a run's JSON Lines
    input: a repeat found in the same block, in an earlier one or only at the last flush is named
    with both lines; distinct ids pass."""
    from seq2seq_eval.errors import DataError
    from seq2seq_eval.inputs import seen
    from seq2seq_eval.selection.candidates import index_candidates

    monkeypatch.setattr(seen, "BLOCK", 4)
    rows = [{"id": i, "source": "s", "candidates": ["a", "b"]} for i in range(10)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert index_candidates(path, "mbr").examples == 10
    rows[at]["id"] = 0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=rf"line {at + 1} field 'id': duplicated id 0 \(first on line 1\)"):
        index_candidates(path, "mbr")
