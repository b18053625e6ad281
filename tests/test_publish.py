"""Outputs published as one unit (outputs/publish.py), known by their content (outputs/record.py,
outputs/digest.py): a publisher killed at each of its steps in turn, two publishers at once, files
copied or edited, prefixes that share a folder. Most cases run the publish itself in a forked
child (fast, no model); two run the command line end to end (tests/publish_faults.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import assert_ok, make_corpus, metric_values, metrics_of, single, write_legacy

from seq2seq_eval.config import EvalConfig
from seq2seq_eval.errors import OutputError
from seq2seq_eval.outputs import digest, publish
from seq2seq_eval.outputs.locations import planned_outputs
from seq2seq_eval.outputs.publish import Staging, recover
from seq2seq_eval.outputs.record import INTENT, RECORD, STAGING, OutputRecord

HERE = Path(__file__).resolve().parent


def visible(folder: Path) -> dict[str, bytes]:
    """Every file a reader sees in the folder (not the tool's bookkeeping), by name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in (RECORD, INTENT)}


def leftovers(folder: Path) -> list[str]:
    """What a finished publish must not leave: an intent, a staging folder, a temporary file."""
    return sorted(p.name for p in folder.iterdir() if p.name in (INTENT, STAGING) or p.name.endswith(".tmp"))


def publish_run(folder: Path, prefix: str, files: dict[str, bytes], completion: str) -> list[str]:
    """A run's publish as write_outputs makes it: every file staged, the completion file (made
    from the names removed) last, the stale results of the prefix removed."""
    staging = Staging(folder, prefix, "output")
    for name, data in files.items():
        staging.add(name, data)
    return staging.publish((completion, lambda removed: json.dumps({"removed": removed}).encode()), stale=True)


def full_set(files: dict[str, bytes], completion: str, removed: list[str]) -> dict[str, bytes]:
    return {**files, completion: json.dumps({"removed": removed}).encode()}


@pytest.fixture
def no_fsync(monkeypatch):
    """fsync skipped: what these tests check is what a killed process leaves, which the page
    cache keeps whether or not it was flushed (a power cut is another matter); the fsyncs of a
    few hundred publishes cost most of their time on this disk."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


SCORED = {"test_generations.txt": b"a1\na2\n", "test_examples.jsonl": b'{"id": 0}\n{"id": 1}\n'}
PSEUDO = {"test_generations.txt": b"b1\nb2\nb3\n", "pseudolabel_results.json": b"[1, 2, 3]\n",
          "test_pseudolabels.jsonl": b'{"c": 1}\n{"c": 2}\n{"c": 3}\n'}


def _watch(folder: Path, kill_at: int | None = None, pause: float = 0.0) -> list[int]:
    """In a forked child: every rename and removal under `folder` counted; the child SIGKILLs
    itself just before the kill_at-th; each waits `pause` seconds first."""
    count = [0]
    for name in ("rename", "replace", "unlink"):
        real = getattr(os, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            paths = args[:1] if _name == "unlink" else args[:2]
            if any(os.path.abspath(p) == str(folder) or os.path.abspath(p).startswith(f"{folder}{os.sep}") for p in paths):
                count[0] += 1
                if count[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(pause)
            return _real(*args, **kwargs)

        setattr(os, name, wrapped)
    return count


def start_child(work: Callable[[], object], folder: Path, kill_at: int | None = None, pause: float = 0.0) -> int:
    """`work` in a forked child (see _watch); returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _watch(folder, kill_at, pause)
        work()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def in_child(work: Callable[[], object], folder: Path, kill_at: int | None = None) -> int:
    """`work` in a forked child, waited for: its wait status."""
    return os.waitpid(start_child(work, folder, kill_at), 0)[1]


def count_changes(work: Callable[[], object], folder: Path) -> int:
    """How many renames and removals `work` makes under `folder` (in a forked child)."""
    marker = folder.parent / f"{folder.name}.count"
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return json.loads(marker.read_text())
    try:
        count = _watch(folder)
        work()
        marker.write_text(json.dumps(count[0]))
    finally:
        os._exit(0)


# ---------------------------------------------------------------- the content digest


def test_the_digest_is_the_same_however_the_bytes_were_written(tmp_path, monkeypatch):
    """Streamed in pieces of any size, read back from the file, or written by ranks in slices at
    offsets and completed by rank 0 (digest.assemble): one digest, the block list's sha256."""
    monkeypatch.setattr(digest, "BLOCK", 64)  # many blocks, cut everywhere
    rng = random.Random(3)
    for size in (0, 1, 63, 64, 65, 640, 1001):
        data = bytes(rng.randrange(256) for _ in range(size))
        path = tmp_path / f"f{size}"
        path.write_bytes(data)
        import hashlib

        expected = hashlib.sha256(b"".join(hashlib.sha256(data[i:i + 64]).digest()
                                           for i in range(0, size, 64))).hexdigest()
        h = digest.ContentHash()
        at = 0
        while at < size:
            step = rng.randint(1, 150)
            h.update(data[at:at + step])
            at += step
        assert h.hexdigest() == digest.file_digest(path, chunk=37) == expected
        for _ in range(5):
            cuts = sorted({0, size, *(rng.randint(0, size) for _ in range(rng.randint(0, 4)))})
            slices = []
            for lo, hi in zip(cuts, cuts[1:]):
                s = digest.SliceHash(lo)
                for piece in range(lo, hi, 50):
                    s.update(data[piece:min(hi, piece + 50)])
                slices.append(s.result())
            assert digest.assemble(path, size, slices) == expected, cuts


# ---------------------------------------------------------------- killed at each step, and two at once


def test_a_publish_killed_at_each_step_leaves_one_complete_set(tmp_path, no_fsync):
    """A folder holds a scored run's set (A); a pseudolabel run of the same prefix (B: other
    files, A's examples and metric file are stale) publishes and is SIGKILLed before each of its
    renames and removals in turn. At every point a reader sees A whole, B whole, or no completion
    file (never a completion file beside a mix); after the next command's recovery the folder
    holds exactly A (killed before the intent) or exactly B, the record vouches for each file,
    and nothing of the publish is left."""
    a = full_set(SCORED, "test_bleu.json", [])
    b = full_set(PSEUDO, "test_run_info.json", ["test_bleu.json", "test_examples.jsonl"])

    def fresh(name: str) -> Path:
        folder = tmp_path / name
        publish_run(folder, "test", SCORED, "test_bleu.json")
        assert visible(folder) == a
        return folder

    probe = fresh("probe")
    n = count_changes(lambda: publish_run(probe, "test", PSEUDO, "test_run_info.json"), probe)
    assert visible(probe) == b and leftovers(probe) == []
    assert n >= 2 + len(b) + 3  # the intent, the moves aside and into place, the record, the clearing
    seen_partial = False
    for k in range(1, n + 1):
        folder = fresh(f"k{k}")
        status = in_child(lambda: publish_run(folder, "test", PSEUDO, "test_run_info.json"), folder, kill_at=k)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, k
        now = visible(folder)
        if "test_bleu.json" in now:
            assert now == a, (k, sorted(now))
        elif "test_run_info.json" in now:
            assert now == b, (k, sorted(now))
        else:
            seen_partial = True
        # The intent is there from the first step to the last but one (the staging folder's
        # marker goes after it).
        assert (folder / INTENT).exists() == (1 < k < n), k
        completed = recover(folder)
        assert visible(folder) == (a if k == 1 else b), k
        assert bool(completed) == (1 < k < n)
        assert leftovers(folder) == [], (k, leftovers(folder))
        record = OutputRecord(folder)
        assert all(record.tool_entry(folder / name).prefix == "test" for name in visible(folder)), k
        assert set(record.files) == set(visible(folder))
        # The next run of the prefix publishes over it as over any set of its own.
        publish_run(folder, "test", SCORED, "test_bleu.json")
        assert visible(folder) == full_set(SCORED, "test_bleu.json", ["pseudolabel_results.json", "test_pseudolabels.jsonl",
                                                                      "test_run_info.json"] if k > 1 else [])
    assert seen_partial  # some kill points fall between the first move and the last


def test_a_publish_whose_staged_files_are_gone_is_undone(tmp_path):
    """Killed after some of its files were in place, with one still staged and then lost: the
    recovery cannot complete it, so it puts back every file it had moved aside: the earlier set,
    whole."""
    folder = tmp_path / "out"
    publish_run(folder, "test", SCORED, "test_bleu.json")
    a = visible(folder)
    in_child(lambda: publish_run(folder, "test", PSEUDO, "test_run_info.json"), folder, kill_at=7)
    staged = list((folder / STAGING).glob("*/new/*"))
    assert staged and (folder / INTENT).exists()
    staged[0].unlink()
    assert recover(folder) == []
    assert visible(folder) == a and leftovers(folder) == []
    assert all(OutputRecord(folder).owns(folder / name) for name in a)


def test_compare_completes_a_publish_cut_short_before_it_reads_the_folder(tmp_path, no_fsync):
    """Killed with its new generations staged and the old ones moved aside: `compare` reading
    the folder completes the publish first, and reads the new set."""
    from seq2seq_eval.comparison.runs import load_run

    folder = tmp_path / "run"
    publish_run(folder, "test", {"test_generations.txt": b"a\nb\n"}, "test_bleu.json")
    in_child(lambda: publish_run(folder, "test", {"test_generations.txt": b"c\nd\n"}, "test_bleu.json"), folder, kill_at=4)
    assert not (folder / "test_generations.txt").exists() and (folder / INTENT).exists()
    assert load_run(folder).predictions == ["c", "d"]
    assert leftovers(folder) == [] and OutputRecord(folder).owns(folder / "test_generations.txt")


def test_two_publishers_at_once_end_with_one_complete_set(tmp_path, no_fsync):
    """Two runs of one prefix publish into one folder at the same time, each change slowed down
    so that unserialized moves would interleave: the folder ends with one complete set (the one
    published last), the record vouches for it, nothing is left over."""
    folder = tmp_path / "out"
    publish_run(folder, "test", {"test_generations.txt": b"old\n"}, "test_bleu.json")
    x = {"test_generations.txt": b"x\n" * 4, "test_examples.jsonl": b"{}\n" * 4}
    y = {"test_generations.txt": b"y\n" * 8, "test_examples.jsonl": b"[]\n" * 8}
    pids = [start_child(lambda files=files: publish_run(folder, "test", files, "test_bleu.json"), folder, pause=0.05)
            for files in (x, y)]
    assert [os.waitpid(pid, 0)[1] for pid in pids] == [0, 0]
    now = visible(folder)
    assert {k: v for k, v in now.items() if k != "test_bleu.json"} in (x, y)
    assert leftovers(folder) == [] and all(OutputRecord(folder).owns(folder / name) for name in now)


def test_an_abandoned_staging_folder_is_removed_and_a_live_one_kept(tmp_path):
    """A run killed while it wrote its outputs (before any publish) leaves its staging folder:
    the next command on the folder removes it, but never one whose owner is still writing."""
    folder = tmp_path / "out"
    live = Staging(folder, "val", "output")
    live.add("val_generations.txt", b"y\n")
    in_child(lambda: (Staging(folder, "test", "output").add("test_generations.txt", b"x\n"), os.kill(os.getpid(), signal.SIGKILL)),
             folder)
    assert len(list((folder / STAGING).iterdir())) == 2
    recover(folder)
    assert [p.name for p in (folder / STAGING).iterdir()] == [live.id]
    live.publish()
    assert visible(folder) == {"val_generations.txt": b"y\n"} and leftovers(folder) == []


def test_staged_files_move_in_place_or_are_copied_across_filesystems(tmp_path, monkeypatch):
    """The shared tail's outputs, assembled in the temp dir, are renamed into the staging folder;
    where the two are on different filesystems they are copied (and their digest checked)."""
    source = tmp_path / "assembled"
    data = os.urandom(3000)
    for across in (False, True):
        source.write_bytes(data)
        staging = Staging(tmp_path / "out", "test", "output")
        if across:
            real = os.rename

            def cross(src, dst):
                if Path(src) == source:
                    raise OSError(18, "Invalid cross-device link")
                return real(src, dst)

            monkeypatch.setattr(publish.os, "rename", cross)
        staging.adopt("test_generations.txt", source, len(data), digest.file_digest(source))
        staging.publish()
        assert (tmp_path / "out" / "test_generations.txt").read_bytes() == data
        assert OutputRecord(tmp_path / "out").owns(tmp_path / "out" / "test_generations.txt")


# ---------------------------------------------------------------- the record knows files by content


def test_the_record_knows_files_by_their_bytes(tmp_path):
    """Unchanged, or copied with `cp -a` (new inode): the tool's. Edited with size and
    modification time kept (`touch -r`): not the tool's, and said so truly. An entry of the
    record's first format (no digest) is never taken for the tool's."""
    folder = tmp_path / "out"
    publish_run(folder, "test", SCORED, "test_bleu.json")
    gen = folder / "test_generations.txt"
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(folder), str(copy)], check=True)
    assert OutputRecord(copy).owns(copy / "test_generations.txt")
    assert OutputRecord(folder).owns(gen)
    stamp = os.stat(gen)
    gen.write_bytes(b"A1\nA2\n")  # same size
    os.utime(gen, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # touch -r
    assert os.stat(gen).st_mtime_ns == stamp.st_mtime_ns and os.stat(gen).st_size == stamp.st_size
    record = OutputRecord(folder)
    assert not record.owns(gen)
    with pytest.raises(OutputError, match=r"test_generations\.txt: is not the file seq2seq_eval wrote here \(its "
                                          r"bytes differ from those in \.seq2seq_eval_outputs\.json\)"):
        record.check_writable([gen], "test")
    # The stale results of the prefix: never the edited file.
    assert [p.name for p in record.stale("test", [])] == ["test_bleu.json", "test_examples.jsonl"]
    old = json.loads((copy / RECORD).read_text())
    old["format"] = 1
    old["files"] = {n: {"size": e["size"], "mtime_ns": e["stamp"][0], "inode": e["stamp"][2]}
                    for n, e in old["files"].items()}
    (copy / RECORD).write_text(json.dumps(old))
    with pytest.raises(OutputError, match="by an earlier release, which kept no digest of its bytes"):
        OutputRecord(copy).check_writable([copy / "test_generations.txt"], "test")


# ---------------------------------------------------------------- prefixes own their files

KINDS = {"scored": {}, "pseudolabels": {"num_return_sequences": 2, "pseudo_target": True},
         "--debug": {"debug": True}}
PREFIXES = ("test", "val", "test_references.v2", "test_references", "pseudolabel", "test.pseudo")


def _planned(folder: Path, prefix: str, kind: str) -> list[Path]:
    return planned_outputs(EvalConfig(save_dir=str(folder), type_path=prefix, **KINDS[kind]), n_refs=2)


def test_two_runs_of_different_prefixes_never_touch_each_others_files(tmp_path, no_fsync):
    """Property: a run (scored, pseudolabels, --debug) of one prefix, then a run of another, in
    either order, into one folder, through the checks and the publish every run makes: the
    second is refused before any work (the one shared name, pseudolabel_results.json) or
    publishes, and none of the first run's files changes or goes, nor its record entries."""
    cases = 0
    for first in PREFIXES:
        for second in PREFIXES:
            if first == second:
                continue
            for k1 in KINDS:
                for k2 in KINDS:
                    folder = tmp_path / f"{cases}"
                    cases += 1
                    one = _planned(folder, first, k1)
                    publish_run(folder, first, {p.name: f"{first} {p.name}\n".encode() for p in one[:-1]}, one[-1].name)
                    before, entries = visible(folder), OutputRecord(folder).files
                    two = _planned(folder, second, k2)
                    try:
                        OutputRecord(folder).check_writable(two, second)
                    except OutputError as e:
                        assert "pseudolabel_results.json" in str(e) and f"prefix {first!r}" in str(e)
                        assert "keeps its legacy name" in str(e) and "give this run another --save_dir" in str(e)
                    else:
                        publish_run(folder, second, {p.name: b"2\n" for p in two[:-1]}, two[-1].name)
                    after, record = visible(folder), OutputRecord(folder)
                    assert {n: after.get(n) for n in before} == before, (first, k1, second, k2)
                    assert all(record.files[n].prefix == first == entries[n].prefix for n in before)
    assert cases == len(PREFIXES) * (len(PREFIXES) - 1) * len(KINDS) ** 2


# ---------------------------------------------------------------- end to end, through the command line


@pytest.fixture(scope="module")
def e2e(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("publish_e2e")
    src, tgt = make_corpus(8, seed=43)
    data = write_legacy(root / "data", src, tgt)
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), "--bs", "4"]
    reference = root / "reference"
    assert_ok(single([*args, "--save_dir", str(reference)], cwd=root))
    return root, args, reference


def _same_outputs(save: Path, reference: Path) -> None:
    for name in ("test_generations.txt", "test_examples.jsonl"):
        assert (save / name).read_bytes() == (reference / name).read_bytes(), name
    assert metric_values(metrics_of(save)) == metric_values(metrics_of(reference))
    assert sorted(p.name for p in save.iterdir()) == [RECORD, "test_bleu.json", "test_examples.jsonl", "test_generations.txt"]
    assert not Path(f"{save}_tmp").exists()


@pytest.mark.parametrize("kill_at, rerun", [(2, []), (6, ["--resume"])])
def test_a_run_killed_in_its_publish_is_completed_by_the_next(e2e, tmp_path, kill_at, rerun):
    """A scored run is SIGKILLed at a rename of its publish over a pseudolabel run's set in the
    same folder: at its 2nd change of the folder (the 1st is the intent: the earlier set's run
    info is about to be moved aside; the checks before work probe the folder in a probe folder of
    their own) or its 6th (every file of the earlier set moved aside, the new ones all still
    staged; test_a_publish_killed_at_each_step tries every step). The next command, a plain
    rerun or --resume, completes the publish, then runs and publishes over it: the outputs are
    the reference's byte for byte, the earlier set's files are gone, no temporary file is left."""
    root, args, reference = e2e
    save = tmp_path / "out"
    assert_ok(single([*args, "--save_dir", str(save), "--num_return_sequences", "2", "--num_beams", "2"], cwd=tmp_path))
    killed = single([str(save), f"kill:{kill_at}", *args, "--save_dir", str(save)], cwd=tmp_path,
                    script=HERE / "publish_faults.py")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    names = sorted(p.name for p in save.iterdir())
    assert "test_bleu.json" not in names or "test_run_info.json" not in names  # never both completion files
    again = single([*args, "--save_dir", str(save), *rerun], cwd=tmp_path)
    assert_ok(again)
    _same_outputs(save, reference)
    # A plain rerun starts over (the dead run's temp dir removed, as it would have removed it);
    # --resume takes every batch from that temp dir's journals and only redoes the tail.
    generated = metrics_of(save)["throughput"]["generated_examples"]
    assert generated == (0 if rerun else 8), again.stderr[-2000:]


def test_two_runs_publishing_into_one_folder_at_once_leave_one_complete_set(e2e, tmp_path):
    """Two runs (4 and 8 examples, their own temp dirs) reach their publish into one --save_dir
    together and every move is slowed down: the folder holds one run's complete set (its
    generations, examples and n_obs agree), the record vouches for each file."""
    root, args, reference = e2e
    save = tmp_path / "out"
    barrier = tmp_path / "barrier"
    runs = [[str(save), f"race:0.3:{barrier}", *args, "--save_dir", str(save), "--tmp_dir", str(tmp_path / f"t{n}"),
             "--n_obs", str(n)] for n in (4, 8)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda argv: single(argv, cwd=tmp_path, script=HERE / "publish_faults.py"), runs))
    for proc in procs:
        assert_ok(proc)
    n_obs = metrics_of(save)["n_obs"]
    assert len((save / "test_generations.txt").read_text().splitlines()) == n_obs
    assert len((save / "test_examples.jsonl").read_text().splitlines()) == n_obs
    record = OutputRecord(save)
    assert all(record.owns(save / name) for name in visible(save)) and leftovers(save) == []


def test_the_dry_run_reports_a_publish_cut_short_and_leaves_it(e2e, tmp_path):
    root, args, reference = e2e
    save = tmp_path / "out"
    killed = single([str(save), "kill:2", *args, "--save_dir", str(save)], cwd=tmp_path, script=HERE / "publish_faults.py")
    assert killed.returncode == -signal.SIGKILL
    before = {p.name for p in save.rglob("*")}
    dry = single([*args, "--save_dir", str(save), "--dry_run"], cwd=tmp_path)
    assert_ok(dry)
    assert "holds a publish cut short" in dry.stderr and {p.name for p in save.rglob("*")} == before


def test_a_record_or_intent_naming_files_outside_its_folder_is_refused(tmp_path, no_fsync):
    """A record (or an intent) edited to name `../victim` vouches for nothing: nothing outside the
    folder is ever replaced or removed through it."""
    folder = tmp_path / "out"
    publish_run(folder, "test", SCORED, "test_bleu.json")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(SCORED["test_generations.txt"])
    data = json.loads((folder / RECORD).read_text())
    data["files"]["../victim.txt"] = data["files"]["test_generations.txt"]
    (folder / RECORD).write_text(json.dumps(data))
    with pytest.raises(OutputError, match=r"unreadable record .*\(a name that is not a plain file name\)"):
        publish_run(folder, "test", PSEUDO, "test_run_info.json")
    (folder / RECORD).write_text(json.dumps({**data, "files": {k: v for k, v in data["files"].items() if "/" not in k}}))
    (folder / INTENT).write_text(json.dumps({"run": "x", "files": [], "remove": ["../victim.txt"]}))
    with pytest.raises(OutputError, match="unreadable record of an interrupted publish"):
        recover(folder)
    assert victim.read_bytes() == SCORED["test_generations.txt"]
