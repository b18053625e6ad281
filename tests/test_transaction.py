"""One command, one transaction over every folder it writes (outputs/publish.py, outputs/intent.py);
what the tool removes or adopts is known by a token, never by a name; the checks before work try
every name in its folder, once per folder, free of races. The publishes run in forked children
(no model): killed (SIGKILL) or signalled (SIGTERM, with the run's handler) before each change of
the folders in turn, found by counting them, not listed by hand; so do evaluate() with in-memory
examples and a run's model-metric phase (a tiny model and a tiny COMET), and `score` is watched
for any change at all."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from seq2seq_eval.config import EvalConfig
from seq2seq_eval.errors import EvalError, Interrupted, OutputError
from seq2seq_eval.outputs.intent import STAGE_MARKER
from seq2seq_eval.outputs.locations import try_folder, try_folders
from seq2seq_eval.outputs.publish import Staging, publish_together, recover
from seq2seq_eval.outputs.record import INTENT, RECORD, STAGING, OutputRecord
from seq2seq_eval.run import tmpdir
from seq2seq_eval.run.runner import _Signals


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch):
    """What a killed process leaves is in the page cache whether or not it was flushed."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def visible(folder: Path) -> dict[str, bytes]:
    """The files a reader sees in the folder (not the tool's bookkeeping), by name."""
    if not folder.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name not in (RECORD, INTENT)}


def everything(root: Path) -> dict[str, bytes]:
    """Every file under `root`, by path: the user's files are compared byte for byte."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name in (INTENT, STAGING)) if folder.is_dir() else []


# The kinds of command, as the folders they publish into: a run's outputs (a completion file
# last, stale results removed), the legacy form (--save_dir's outputs, SAVE_PATH and SCORE_PATH:
# three folders, or two of them shared), a named file alone (compare --report).
def run_set(tag: str) -> dict[str, bytes]:
    return {"test_generations.txt": f"{tag}1\n{tag}2\n".encode(), "test_examples.jsonl": f'{{"t": "{tag}"}}\n'.encode()}


def stage_run(folder: Path, tag: str) -> Staging:
    staging = Staging(folder, "test", "output")
    for name, data in run_set(tag).items():
        staging.add(name, data)
    return staging.plan(("test_bleu.json", lambda removed: json.dumps({"run": tag, "removed": removed}).encode()),
                        stale=True)


def stage_named(folder: Path, files: dict[str, bytes], completes: tuple[str, ...] = ()) -> Staging:
    staging = Staging(folder, None, "named")
    for name, data in files.items():
        staging.add(name, data)
    return staging.plan(way_out="name another file", completes=[n for n in completes if n in files])


def legacy(save: Path, out: Path, score: Path, tag: str) -> list[Staging]:
    """The legacy form's transaction: SAVE_PATH in `out`, SCORE_PATH in `score`, --save_dir `save`
    (folders may coincide: then one staging holds the files of each)."""
    named = {out: {"preds.txt": f"{tag} preds\n".encode()}}
    named.setdefault(score, {})["metrics.json"] = f'{{"bleu": "{tag}"}}\n'.encode()
    stagings = []
    run = stage_run(save, tag)
    for folder, files in named.items():
        if folder == save:
            for name, data in files.items():
                run.add(name, data, (None, "named"))
            run.options["completes"] = [n for n in files if n == "metrics.json"]
        else:
            stagings.append(stage_named(folder, files, ("metrics.json",)))  # SCORE_PATH completes its folder
    return [*stagings, run]


def tool_view(folders: list[Path]) -> list[dict[str, bytes]]:
    return [visible(f) for f in folders]


def _watch(root: Path, at: int | None, action: Callable[[], None], folders: bool = False) -> list[int]:
    """In a forked child: every rename and removal under `root` counted (with `folders`, only
    those of a file in `root`'s folders, as tests/publish_faults.py's tree mode counts them);
    `action` runs just before the at-th."""
    count = [0]

    def counted(path: str) -> bool:
        if folders:
            return os.path.dirname(os.path.dirname(os.path.abspath(path))) == str(root)
        return os.path.abspath(path).startswith(f"{root}{os.sep}")

    for name in ("rename", "replace", "unlink"):
        real = getattr(os, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            paths = args[:1] if _name == "unlink" else args[:2]
            if any(counted(p) for p in paths):
                count[0] += 1
                if count[0] == at:
                    action()
            return _real(*args, **kwargs)

        setattr(os, name, wrapped)
    return count


def in_child(work: Callable[[], object], root: Path, at: int | None = None, sig: int = signal.SIGKILL,
             folders: bool = False) -> tuple[int, dict]:
    """`work` in a forked child, `sig` sent to itself before its at-th change under `root`, with
    the run's SIGINT/SIGTERM handler in place. Returns its wait status and what it reported:
    its change count, or the Interrupted it raised."""
    report = root.parent / f"{root.name}.report"
    pid = os.fork()
    if pid:
        status = os.waitpid(pid, 0)[1]
        data = json.loads(report.read_text()) if report.exists() else {}
        report.unlink(missing_ok=True)
        return status, data
    code = 1
    try:
        count = _watch(root, at, lambda: os.kill(os.getpid(), sig), folders)
        try:
            with _Signals():
                work()
            report.write_text(json.dumps({"changes": count[0]}))
        except Interrupted as e:
            report.write_text(json.dumps({"interrupted": str(e), "published": e.published}))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def pseudolabels(folder: Path, tag: str) -> Staging:
    """A pseudolabel run's set (its run-info file is its completion file)."""
    staging = Staging(folder, "test", "output")
    staging.add("test_generations.txt", f"{tag}\n".encode())
    staging.add("pseudolabel_results.json", f'["{tag}"]\n'.encode())
    return staging.plan(("test_run_info.json", lambda removed: json.dumps({"run": tag}).encode()), stale=True,
                        completes=["pseudolabel_results.json"])


# Every kind of command, as the folders it writes and what it stages there for a run tagged `tag`
# (the run and --save_dir's outputs with a model metric publish as a run does; `score` writes
# nothing). A kind's folders are named relative to the case's root.
KINDS: dict[str, tuple[tuple[str, ...], Callable[[list[Path], str], list[Staging]]]] = {
    "legacy form, three folders": (("save", "out", "score"), lambda f, tag: legacy(f[0], f[1], f[2], tag)),
    "legacy form, SAVE_PATH beside SCORE_PATH": (("save", "out"), lambda f, tag: legacy(f[0], f[1], f[1], tag)),
    "run, then pseudolabels": (("save",), lambda f, tag: [stage_run(f[0], tag) if tag != "two" else pseudolabels(f[0], tag)]),
    "compare --report": (("r",), lambda f, tag: [stage_named(f[0], {"report.html": f"<p>{tag}</p>\n".encode()},
                                                             ("report.html",))]),
}
# Each kind with each signal, but for two whose steps another case takes in the same order: the
# single-folder run with SIGKILL (tests/test_publish.py's loop) and the legacy form's two folders
# with SIGKILL (those of three folders). The legacy form in one folder is one folder's publish.
CASES = [(sig, kind) for kind in KINDS for sig in (signal.SIGKILL, signal.SIGTERM)
         if (kind, sig) not in (("run, then pseudolabels", signal.SIGKILL),
                                ("legacy form, SAVE_PATH beside SCORE_PATH", signal.SIGKILL))]


@pytest.mark.parametrize("sig, kind", CASES, ids=[f"{k}-{signal.Signals(s).name}" for s, k in CASES])
def test_a_command_stopped_at_each_step_leaves_one_run_in_every_folder(tmp_path, kind, sig):
    """Run 1's set is in place; run 2's publish is stopped before each of its changes in turn (the
    count of its changes, not a list). At every point every folder holds run 1's files or run
    2's, never one folder of each, once the next command (a recovery of any one of the folders)
    is done; with SIGTERM the command says whether it published, and it did exactly when the
    folders hold run 2's set."""
    names, command = KINDS[kind]
    whole = []  # each run's set, as a publish that runs to its end leaves it
    for tag in ("one", "two"):
        publish_together(command([tmp_path / "probe" / n for n in names], tag))
        whole.append(tool_view([tmp_path / "probe" / n for n in names]))
    for k in range(1, 200):
        root = tmp_path / f"{k}"
        folders = [root / n for n in names]
        publish_together(command(folders, "one"))
        one = tool_view(folders)
        status, said = in_child(lambda: publish_together(command(folders, "two")), root, k, sig)
        if sig == signal.SIGKILL and not os.WIFSIGNALED(status) or "changes" in said:
            assert k > 1 and "changes" in said, (k, status, said)  # every step was tried
            return
        # The next command touches one folder only (here the last one); it completes or undoes all.
        recover(folders[k % len(folders)])
        now = tool_view(folders)
        assert one == whole[0] and now in whole, (k, now)
        two = now == whole[1]
        if sig == signal.SIGTERM:
            assert said["published"] == two, (k, said)
            assert ("after the outputs were published" in said["interrupted"]) == two
        for f in folders:
            recover(f)  # what a dead publisher left staged goes with the next command on its folder
            assert tool_view(folders) == now, k
        for f in folders:
            assert leftovers(f) == [], (k, f, leftovers(f))
            record = OutputRecord(f)
            assert all(record.owns(f / n) for n in visible(f)), k
    raise AssertionError("the publish never ended")


COMPLETION = {"test_bleu.json", "test_run_info.json", "pseudolabel_results.json", "metrics.json", "report.html"}
"""The completion files of KINDS: their presence says a run completed."""


def _run_of(data: bytes) -> str | None:
    return "two" if b"two" in data else "one" if b"one" in data else None


def consistent(folders: list[Path]) -> bool:
    """What a reader may see at any instant: wherever a completion file is in place, in any
    folder, every file in place in every folder is of its run."""
    shown = [v for f in folders for v in visible(f).items()]
    if not any(name in COMPLETION for name, _ in shown):
        return True
    return len({_run_of(data) for _, data in shown}) == 1


FAULTS = {"EPERM": 1, "ENOSPC": 28, "EIO": 5}
_OPS = ("rename", "replace", "unlink", "link", "mkdir", "rmdir", "open")


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_fault_at_each_step_of_a_publish_is_undone_at_once_or_left_whole(tmp_path, kind, monkeypatch):
    """Every filesystem operation a publish makes in its folders (found by counting them: each
    rename, removal, link, folder made or removed, file opened to be written), in turn, fails with
    EPERM, ENOSPC and EIO. The publish meets it at once, under its locks: one OutputError saying
    it was undone, the folders holding run 1's set as before (the records as they were); or, the
    fault coming once every folder held run 2's files and record, no error and run 2's set in
    place. At no instant (checked before each operation) does a completion file stand beside a
    file of the other run, in any folder; the next command leaves nothing behind."""
    names, command = KINDS[kind]
    tried = 0
    steps = None
    for fault, code in [("none", 0), *FAULTS.items()]:  # a whole publish first, its steps counted
        for k in [0] if steps is None else _sampled(steps, f"{kind}{fault}"):
            root = tmp_path / f"{fault}{k}"
            folders = [root / n for n in names]
            publish_together(command(folders, "one"))
            one, records = tool_view(folders), [(f / RECORD).read_bytes() for f in folders]
            stagings = command(folders, "two")
            count, seen = [0], []

            def wrapped(*args, _real, _name, **kwargs):
                paths = [a for a in args[:2] if isinstance(a, (str, os.PathLike))]
                if _name == "open" and not (len(args) > 1 and args[1] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
                    paths = []
                if any(os.path.abspath(p).startswith(f"{root}{os.sep}") for p in paths):
                    seen.append(consistent(folders))
                    count[0] += 1
                    if count[0] == k:
                        raise OSError(code, os.strerror(code), str(paths[0]))
                return _real(*args, **kwargs)

            with monkeypatch.context() as m:
                for name in _OPS:
                    m.setattr(os, name, lambda *a, _real=getattr(os, name), _name=name, **kw: wrapped(*a, _real=_real, _name=_name, **kw))
                try:
                    publish_together(stagings)
                    error = None
                except EvalError as e:
                    error = str(e)
            assert all(seen), (fault, k)
            if k == 0:
                steps = count[0]  # the steps of a whole publish, counted
                assert steps > 5 and error is None, (steps, error)
                continue
            tried += 1
            now = tool_view(folders)
            if error is not None:
                # Before its intents nothing has changed (the completion file made in the staging folder
                # failed); after, the publish was undone: the line says which.
                assert "\n" not in error and ("; undone: " in error or "the previous version, if any, is unchanged" in error), error
                assert now == one, (fault, k, error)
                assert [(f / RECORD).read_bytes() for f in folders] == records, (fault, k)
            else:
                assert consistent(folders) and _run_of(b"".join(b for v in now for b in v.values())) == "two", (fault, k)
            for f in folders:
                recover(f)
                assert leftovers(f) == [] and tool_view(folders) == now, (fault, k, f)
                assert all(OutputRecord(f).owns(f / n) for n in visible(f)), (fault, k)
    print(f"{kind}: {steps} steps, {tried} faults tried")
    assert tried >= len(FAULTS) * min(steps, 6)


def _sampled(steps: int, seed: str) -> list[int]:
    """Which steps fail: every one with S2S_EVERY_STEP=1 (scripts/fault_loop.py's whole loop);
    in the suite the first, the last and five more, drawn with a fixed seed."""
    if os.environ.get("S2S_EVERY_STEP") == "1":
        return list(range(1, steps + 1))
    return sorted({1, steps, *random.Random(seed).sample(range(1, steps + 1), min(5, steps))})


def test_two_commands_interleaved_keep_every_user_file_and_each_transaction_whole(tmp_path):
    """Property, over seeded random cases: a legacy command (three folders) and another command
    (a run into one of them, or a report beside a user's files) race, each stopped at a random
    step or not at all; then the next command recovers. Every user file keeps its bytes, and each
    folder holds exactly one command's set, the legacy command's in all its folders or in none."""
    rng = random.Random(5)
    for case in range(8):
        root = tmp_path / f"{case}"
        save, out, score = root / "save", root / "out", root / "score"
        for f in (save, out, score):
            f.mkdir(parents=True)
            (f / "notes.txt").write_bytes(os.urandom(64))
            (f / STAGING).mkdir()
            (f / STAGING / "mine").mkdir()
            (f / STAGING / "mine" / "new").mkdir()
            (f / STAGING / "mine" / "new" / "draft.txt").write_bytes(b"the user's own\n")
        user = everything(root)
        publish_together(legacy(save, out, score, "base"))
        other_kind = rng.choice(["run", "report"])
        other_folder = rng.choice([save, out, score])

        def other() -> None:
            if other_kind == "run":
                publish_together([stage_run(other_folder, "other")])
            else:
                publish_together([stage_named(other_folder, {"report.html": b"<p>other</p>\n"})])

        pids = []
        for work, at in ((lambda: publish_together(legacy(save, out, score, "new")), rng.choice([None, *range(1, 25)])),
                         (other, rng.choice([None, *range(1, 12)]))):
            pid = os.fork()
            if pid == 0:
                try:
                    _watch(root, at, lambda: os.kill(os.getpid(), signal.SIGKILL))
                    work()
                finally:
                    os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        for f in (save, out, score):
            recover(f)
        after = everything(root)
        assert {p: after.get(p) for p in user} == user, case
        # SAVE_PATH and SCORE_PATH: the legacy command's new set in both, or in neither.
        tags = {b"new" in (f / name).read_bytes() for f, name in ((out, "preds.txt"), (score, "metrics.json"))}
        assert len(tags) == 1, case
        for f in (save, out, score):
            assert not (f / INTENT).exists()
            record = OutputRecord(f)
            assert all(record.owns(f / n) for n in record.files), case
            if (f / "test_bleu.json").exists():  # a run's set is whole: its generations are its own
                tag = json.loads((f / "test_bleu.json").read_text())["run"]
                assert (f / "test_generations.txt").read_bytes() == run_set(tag)["test_generations.txt"], case
                if f == save and tag != "other":
                    assert tags == {tag == "new"}, case  # --save_dir's outputs go with SAVE_PATH


# ---------------------------------------------------------------- ownership by token


def test_a_users_folder_named_like_a_staging_folder_is_left_alone(tmp_path, caplog):
    """`S/.seq2seq_eval_staging/notes/` with files in new/ and tmp/: every command on S leaves
    it, saying why in one line; the tool's own abandoned staging folder beside it is removed."""
    folder = tmp_path / "S"
    notes = folder / STAGING / "notes"
    for sub in ("new", "tmp", "old"):
        (notes / sub).mkdir(parents=True)
        (notes / sub / "draft.txt").write_bytes(f"{sub}\n".encode())
    # A marker file of the tool's name without a token, and one with a token but not a regular file.
    (notes / STAGE_MARKER).write_bytes(b"")
    fake = folder / STAGING / "fake"
    (fake / "new").mkdir(parents=True)
    (fake / "new" / "a.txt").write_bytes(b"a\n")
    (fake / f"{STAGE_MARKER}.{'0' * 32}").mkdir()
    before = everything(folder)
    status, _ = in_child(lambda: Staging(folder, "test", "output").add("x.txt", b"x\n"), tmp_path, 10**6)
    with caplog.at_level(logging.WARNING, logger="seq2seq_eval"):
        publish_together([stage_run(folder, "a")])
    after = everything(folder)
    assert {p: after.get(p) for p in before} == before
    assert sorted(p.name for p in (folder / STAGING).iterdir()) == ["fake", "notes"]  # the abandoned one went
    said = [r.getMessage() for r in caplog.records if "left alone" in r.getMessage()]
    assert len(said) == 2 and all("not a staging folder seq2seq_eval made" in s for s in said)


def test_an_intent_whose_staging_folder_does_not_carry_its_token_is_left_alone(tmp_path):
    """An intent written by hand (no token), one naming a staging folder that carries another
    token, or one whose staging folder is not there: refused in one line, nothing in the folder
    moves."""
    folder = tmp_path / "S"
    publish_together([stage_run(folder, "a")])
    (folder / STAGING / "x" / "new").mkdir(parents=True)
    (folder / STAGING / "x" / "new" / "test_generations.txt").write_bytes(b"mine\n")
    (folder / STAGING / "x" / f"{STAGE_MARKER}.{'1' * 32}").write_bytes(b"")
    for intent, match in (({"run": "x", "files": [], "remove": ["test_generations.txt"]}, "no run token"),
                          ({"run": "x", "token": "2" * 32, "files": [{"name": "test_generations.txt", "size": 5,
                                                                      "sha256": "0"}], "remove": []},
                           "does not carry that run's token"),
                          ({"run": "y", "token": "3" * 32, "files": [], "remove": ["test_generations.txt"]},
                           "y is missing or does not carry")):
        (folder / INTENT).write_text(json.dumps(intent))
        before = everything(folder)
        with pytest.raises(OutputError, match=match):
            recover(folder)
        with pytest.raises(OutputError, match=match):
            publish_together([stage_run(tmp_path / "elsewhere", "b"), stage_run(folder, "b")])
        assert everything(folder) == before
        assert not (tmp_path / "elsewhere" / "test_bleu.json").exists()


@pytest.mark.parametrize("claimed_since", [False, True])
def test_recovery_removes_a_temp_dir_only_while_it_carries_the_dead_runs_token(tmp_path, claimed_since):
    """Run A dies in its publish; its temp dir T is removed by hand and made again by run C (its
    own token), which is interrupted with journals there. Completing A's publish later leaves T
    and C's journals alone, saying why; T still A's (no run since) goes as A would have removed it."""
    folder, t = tmp_path / "S", tmp_path / "T"
    tmpdir.claim_tmp_dir(t)
    token_a = tmpdir.new_token(t)

    def run_a() -> None:
        staging = Staging(folder, "test", "output", t, token_a)
        staging.add("test_generations.txt", b"a\n")
        staging.publish()

    status, _ = in_child(run_a, tmp_path, at=2)  # past the intent: the next command completes it
    assert os.WIFSIGNALED(status) and (folder / INTENT).exists()
    if claimed_since:
        for p in t.iterdir():
            p.unlink()
        t.rmdir()
        tmpdir.claim_tmp_dir(t)
        tmpdir.new_token(t)
        (t / "journal_rank_0.jsonl").write_text('{"batch": 0}\n')
    completed = recover(folder)
    assert [i["tmp_token"] for i in completed] == [token_a]
    tmpdir.remove_finished_tmp_dir(Path(completed[0]["tmp_dir"]), completed[0]["tmp_token"])
    assert t.exists() == claimed_since
    if claimed_since:
        assert (t / "journal_rank_0.jsonl").read_text() == '{"batch": 0}\n'


# ---------------------------------------------------------------- the checks before work


def test_every_final_name_is_tried_in_its_folder(tmp_path):
    """A --type_path whose outputs' names the filesystem refuses fails the check before work
    (the dry run and the run make it), in one line naming the file; a folder given twice
    (SAVE_PATH beside SCORE_PATH) is tried once."""
    cfg = EvalConfig(save_dir=str(tmp_path / "out"), type_path="t" * 240)
    with pytest.raises(OutputError, match=r"--save_dir .*: cannot create t{240}_generations\.txt in .*File name too long"):
        try_folders(cfg)
    assert not (tmp_path / "out").exists()
    ok = EvalConfig(save_dir=str(tmp_path / "out"))
    from seq2seq_eval.outputs.locations import Role

    with pytest.raises(OutputError, match=r"cannot create m{251}\.json in "):
        try_folders(ok, (Role(tmp_path / "p.txt", "SAVE_PATH"), Role(tmp_path / f"{'m' * 251}.json", "--score_path")),
                    (("SAVE_PATH", tmp_path), ("--score_path", tmp_path / "x" / "..")))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_many_processes_trying_one_new_folder_at_once_all_pass(tmp_path):
    """Sixteen processes try one folder that is not there yet (and its parent), at the same time,
    over and over: none fails, and no probe is left (a folder another process still used when
    its maker was done may stay, empty)."""
    for attempt in range(4):
        target = tmp_path / f"new{attempt}" / "save"
        pids = []
        for _ in range(16):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    try_folder("--save_dir", target, ["test_generations.txt"])
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            pids.append(pid)
        assert [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids] == [0] * 16
        assert not [p for p in target.parent.rglob("*") if not p.is_dir()]
        assert not list(target.glob(".seq2seq_eval_probe*"))


# ---------------------------------------------------------------- through the command line


@pytest.fixture(scope="module")
def e2e(tiny_model, tmp_path_factory):
    from conftest import make_corpus

    root = tmp_path_factory.mktemp("txn_e2e")
    src, tgt = make_corpus(6, seed=47)
    (root / "in.txt").write_text("\n".join(src) + "\n")
    (root / "ref.txt").write_text("\n".join(tgt) + "\n")
    return root, str(tiny_model)


def test_the_legacy_form_publishes_its_three_folders_as_one_transaction(e2e, tmp_path):
    """`MODEL in.txt out/preds.txt --reference_path ref.txt --score_path sc/metrics.json
    --save_dir S`, killed once SAVE_PATH is in place and before SCORE_PATH is: any next command on
    one of the folders completes all three, and SCORE_PATH's scores are those of --save_dir's."""
    from seq2seq_eval.cli import main

    root, model = e2e
    w = tmp_path / "w"
    args = [model, str(root / "in.txt"), str(w / "out" / "preds.txt"), "--reference_path", str(root / "ref.txt"),
            "--score_path", str(w / "sc" / "metrics.json"), "--save_dir", str(w / "S"), "--tmp_dir", str(tmp_path / "t"),
            "--bs", "4", "--task", "translation"]
    # Changes in w's folders: the three intents (SCORE_PATH's, SAVE_PATH's, --save_dir's last:
    # the commit point), then SAVE_PATH's folder's move into place (the 4th), then SCORE_PATH's.
    status, _ = in_child(lambda: main(args), w, 5, folders=True)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    intents = [json.loads((w / f / INTENT).read_text()) for f in ("S", "out", "sc")]
    assert len({i["txn"]["token"] for i in intents}) == 1 and (w / "out" / "preds.txt").exists()
    assert not (w / "sc" / "metrics.json").exists() and not (w / "S" / "test_bleu.json").exists()
    recover(w / "sc")
    assert not any((w / f / INTENT).exists() for f in ("S", "out", "sc"))
    scores = json.loads((w / "sc" / "metrics.json").read_text())
    assert scores["bleu"] == json.loads((w / "S" / "test_bleu.json").read_text())["bleu"]
    assert (w / "out" / "preds.txt").read_bytes() == (w / "S" / "test_generations.txt").read_bytes()


def test_a_sigterm_in_the_publish_ends_the_run_published_and_says_so(e2e, tmp_path):
    """SIGTERM between two renames of the publish: the run completes it, exits 130 saying the
    outputs were published (no resume to run), and removes its temp dir as a finished run does."""
    from conftest import single

    root, model = e2e
    save = tmp_path / "out"
    args = [model, str(root / "in.txt"), str(save / "preds.txt"), "--reference_path", str(root / "ref.txt"),
            "--score_path", str(save / "metrics.json"), "--bs", "4", "--task", "translation"]
    term = single([str(save), "term:3", *args], cwd=tmp_path, script=Path(__file__).parent / "publish_faults.py")
    assert term.returncode == 130, term.stderr[-2000:]
    line = [s for s in term.stderr.splitlines() if s.startswith("seq2seq_eval: error:")]
    assert len(line) == 1 and "after the outputs were published" in line[0] and "the run is complete" in line[0], line
    assert "resume" not in line[0] and "did not finish" not in line[0]
    assert sorted(p.name for p in save.iterdir()) == [RECORD, "metrics.json", "preds.txt"]
    assert len((save / "preds.txt").read_text().splitlines()) == 6


def test_the_dry_run_says_once_per_folder_and_tries_every_name(e2e, tmp_path):
    """SAVE_PATH, SCORE_PATH and --save_dir in one folder holding a publish cut short: the dry run
    says so once. A --type_path whose output names the filesystem refuses fails the dry run."""
    from conftest import single

    root, model = e2e
    s = tmp_path / "S"
    status, _ = in_child(lambda: publish_together([stage_run(s, "a")]), tmp_path, at=2)
    assert os.WIFSIGNALED(status) and (s / INTENT).exists()
    args = [model, str(root / "in.txt"), str(s / "preds.txt"), "--reference_path", str(root / "ref.txt"),
            "--score_path", str(s / "metrics.json"), "--save_dir", str(s), "--bs", "4", "--task", "translation"]
    dry = single([*args, "--dry_run"], cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert dry.stderr.count("holds a publish cut short") == 1, dry.stderr
    long = single([*args, "--type_path", "t" * 240, "--dry_run"], cwd=tmp_path)
    assert long.returncode == 2 and "File name too long" in long.stderr and "Traceback" not in long.stderr, long.stderr


# ---------------------------------------------------------------- evaluate()'s inputs with its outputs


def _evaluate_set(folder: Path) -> dict[str, object]:
    """What a reader of evaluate()'s save folder compares: every file's bytes, the metric file's
    scores and data (its timings and dates differ from run to run)."""
    view: dict[str, object] = dict(visible(folder))
    if "test_bleu.json" in view:
        metric = json.loads(view["test_bleu.json"])
        data = metric["provenance"]["data"]
        view["test_bleu.json"] = (metric["bleu"], metric["n_obs"], data["sha256"], Path(data["path"]).name)
    return view


def test_evaluate_publishes_its_in_memory_inputs_with_its_outputs(tiny_model, tmp_path):
    """evaluate() with in-memory examples into a folder holding another evaluation's set, killed
    before each change of the save folder in turn, found by counting them. Once the next command
    has run (a recovery of the folder), the folder holds the earlier evaluation's inputs and
    outputs, or the new one's, never inputs of one beside outputs of the other. A SIGTERM in
    the publish ends evaluate() with the new set in place, and its Interrupted says so."""
    import shutil

    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from seq2seq_eval import evaluate

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)
    data = {"one": (["one two three", "four five"], ["a b", "c d"]), "two": (["six seven", "eight", "nine ten"], ["e", "f g", "h"])}

    def evaluation(save: Path, tag: str) -> None:
        torch.set_num_threads(1)
        evaluate(model, tokenizer, sources=data[tag][0], references=data[tag][1], save_dir=str(save),
                 tmp_dir=str(save.parent / "t"), bs=4, metrics="bleu", num_beams=1, max_new_tokens=3)

    whole = {}
    for tag in ("one", "two"):
        evaluation(tmp_path / tag / "out", tag)
        whole[tag] = _evaluate_set(tmp_path / tag / "out")
    assert whole["one"] != whole["two"] and "test_inputs.jsonl" in whole["one"]
    assert not (tmp_path / "one" / "t").exists()  # the scratch copy went with the temp dir
    # A file of the user's where the copy goes is refused before any work, and kept.
    (tmp_path / "user" / "out").mkdir(parents=True)
    (tmp_path / "user" / "out" / "test_inputs.jsonl").write_bytes(b"mine\n")
    with pytest.raises(OutputError, match=r"test_inputs\.jsonl \(the examples evaluate\(\) was given\): exists and "):
        evaluation(tmp_path / "user" / "out", "one")
    assert everything(tmp_path / "user") == {"out/test_inputs.jsonl": b"mine\n"}
    # A later run of the prefix from other data removes the copy with the other stale results (it
    # would be one run's inputs beside another's outputs); one that reads the copy keeps it.
    torch.set_num_threads(1)
    for name, kept in (("other", False), ("copy", True)):
        later = tmp_path / name / "out"
        shutil.copytree(tmp_path / "one" / "out", later)
        data_dir = later / "test_inputs.jsonl" if kept else tmp_path / "two" / "out" / "test_inputs.jsonl"
        evaluate(model, tokenizer, data_dir=str(data_dir), save_dir=str(later), tmp_dir=str(later.parent / "t"), bs=4,
                 metrics="bleu", num_beams=1, max_new_tokens=3)
        assert sorted(visible(later)) == sorted(set(whole["one"]) - ({"test_inputs.jsonl"} if not kept else set()))
        assert ("test_inputs.jsonl" in json.loads((later / "test_bleu.json").read_text())["provenance"]
                ["removed_stale_outputs"]) != kept
    for k in range(1, 200):
        save = tmp_path / f"{k}" / "out"
        shutil.copytree(tmp_path / "one" / "out", save)  # a copy is the tool's: the same bytes
        status, said = in_child(lambda: evaluation(save, "two"), save, k)
        if not os.WIFSIGNALED(status):
            assert k > 2 and said["changes"] == k - 1, (k, status, said)  # every step was tried
            break
        recover(save)
        now = _evaluate_set(save)
        assert now in (whole["one"], whole["two"]), (k, sorted(now))
        assert leftovers(save) == [], (k, leftovers(save))
    else:
        raise AssertionError("the evaluation never ended")
    # SIGTERM in the publish: it completes first, and evaluate() raises Interrupted saying so.
    save = tmp_path / "term" / "out"
    shutil.copytree(tmp_path / "one" / "out", save)
    status, said = in_child(lambda: evaluation(save, "two"), save, k // 2, signal.SIGTERM)
    assert said["published"] and "after the outputs were published" in said["interrupted"], said
    assert _evaluate_set(save) == whole["two"] and leftovers(save) == []


# ---------------------------------------------------------------- a model metric's phase, and score


COMET = Path(__file__).parent / "data" / "comet_tiny" / "wmt22_like"
_CHANGES = ("rename", "replace", "unlink", "open", "fsync")


def _path_of(name: str, args: tuple) -> list[str]:
    if name == "fsync":
        try:
            return [os.readlink(f"/proc/self/fd/{args[0] if isinstance(args[0], int) else args[0].fileno()}")]
        except OSError:
            return []
    if name == "open" and not (len(args) > 1 and args[1] & os.O_CREAT):
        return []  # only a file created is a change
    return [os.path.abspath(p) for p in (args[:2] if name in ("rename", "replace") else args[:1])]


def _fork_at_each_step(work: Callable[[], object], roots: list[Path], start: str, stop: Path, sig: int,
                       keep: Callable[[int, int], None]) -> int:
    """`work` in a forked child up to the first change under `roots` whose path holds `start`;
    from there, for k = 1, 2, ...: a grandchild goes on and sends itself `sig` before its k-th
    change (a file renamed, replaced, removed or created, or made durable by fsync) under `roots`,
    with the run's handler in place. Once it is gone, `keep(k, its wait status)` checks and saves
    what it left, and `roots` are put back as they were at the fork point for the next. Ends when
    a grandchild reaches its first change under `stop` before its k-th. Returns the number of
    steps."""
    report = stop.parent / "steps.json"
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        said = json.loads(report.read_text()) if report.exists() else {}
        assert "steps" in said, said.get("error", said)
        return said["steps"]
    state = {"count": 0, "at": 0, "child": False}

    def fork_tree() -> None:
        import shutil

        snap = stop.parent / "fork_point"
        for r in roots:
            if r.exists():
                shutil.copytree(r, snap / r.name, symlinks=True)
        for k in range(1, 1000):
            reached = stop.parent / "reached"
            child = os.fork()
            if child == 0:
                state.update(count=0, at=k, child=True)
                return
            status = os.waitpid(child, 0)[1]
            if reached.exists():
                report.write_text(json.dumps({"steps": k - 1}))
                os._exit(0)
            keep(k, status)
            for r in roots:
                shutil.rmtree(r, ignore_errors=True)
                if (snap / r.name).exists():
                    shutil.copytree(snap / r.name, r, symlinks=True)
        raise AssertionError("the steps never ended")

    def wrap(name: str) -> None:
        real = getattr(os, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            paths = _path_of(_name, args)
            if any(p.startswith(f"{stop}{os.sep}") for p in paths) and state["child"]:
                (stop.parent / "reached").write_text("")
                os._exit(0)
            if any(p.startswith(f"{r}{os.sep}") for p in paths for r in roots):
                if state["at"] == 0 and any(start in p for p in paths):
                    fork_tree()
                if state["at"]:
                    state["count"] += 1
                    if state["count"] == state["at"]:
                        os.kill(os.getpid(), sig)
            return _real(*args, **kwargs)

        setattr(os, name, wrapped)

    code = 0
    try:
        for name in _CHANGES:
            wrap(name)
        with _Signals():
            code = work()
    except BaseException:
        if not state["child"]:
            report.write_text(json.dumps({"error": traceback.format_exc()}))
        code = 1
    os._exit(code if isinstance(code, int) else 0)


BERTSCORE = Path(__file__).parent / "data" / "bertscore_tiny"
# Each model metric's options (a budget that cuts three examples into two batches or more) and
# the metric file's keys it writes.
MODEL_METRICS = {
    "comet": (["--comet_model", str(COMET), "--comet_max_tokens", "40"], ("comet", "comet_signature")),
    "bertscore": (["--bertscore_model", str(BERTSCORE / "roberta"), "--bertscore_num_layers",
                   str(json.loads((BERTSCORE / "reference_scores.json").read_text())["layers"]), "--bertscore_idf",
                   "--model_metric_max_tokens", "24"],
                  ("bertscore", "bertscore_precision", "bertscore_recall", "bertscore_signature")),
}


@pytest.mark.parametrize("metric", MODEL_METRICS)
def test_a_run_stopped_at_each_step_of_its_model_metric_phase_resumes_to_the_same_bytes(tiny_model, tmp_path, capfd,
                                                                                     metric):
    """A run scoring with a model metric after generation (a tiny COMET; a tiny BERTScore with
    idf and two references per example), killed (SIGKILL) or signalled (SIGTERM) before each
    change of its temp dir in turn, from the model metric's first claim to its publish: --resume
    then takes the journaled batches, scores only the others and leaves the outputs of an
    uninterrupted run, byte for byte, and nothing else. `score` with COMET changes no file."""
    import shutil

    from seq2seq_eval.cli import main

    samples = json.loads((COMET.parent / "reference_scores.json").read_text())["samples"]
    data = tmp_path / "test.jsonl"
    refs = [t if metric == "comet" else [t, " ".join(t.split()[1:] + t.split()[:1])] for t in samples["ref"][:3]]
    data.write_text("".join(json.dumps({"id": i, "source": s, "target": t}) + "\n"
                            for i, (s, t) in enumerate(zip(samples["src"][:3], refs))))
    options, keys = MODEL_METRICS[metric]
    args = ["--model_name", str(tiny_model), "--data_dir", str(data), "--metrics", f"bleu,{metric}", *options,
            "--bs", "4", "--num_beams", "1", "--max_new_tokens", "4"]

    def outputs(save: Path) -> dict[str, object]:
        view: dict[str, object] = dict(visible(save))
        scores = json.loads(view.pop("test_bleu.json"))
        view["scores"] = {k: scores[k] for k in ("bleu", "n_obs", *keys)}
        return view

    assert main([*args, "--save_dir", str(tmp_path / "whole" / "out"), "--tmp_dir", str(tmp_path / "whole" / "t")]) == 0
    capfd.readouterr()
    whole = outputs(tmp_path / "whole" / "out")
    assert f'"{metric}": ' in whole["test_examples.jsonl"].decode()
    if metric == "comet":
        # `score` with the same metrics over those files, as a whole command, changes no file at
        # all: a kill at any point of it leaves every folder as it was, nothing for a next command.
        files = {}
        for name, key in (("p.txt", "mt"), ("r.txt", "ref"), ("s.txt", "src")):
            files[name] = tmp_path / name
            files[name].write_text("".join(t + "\n" for t in samples[key][:3]))
        code, changes = _changes_made(lambda: main(["score", "--predictions", str(files["p.txt"]), "--references",
                                                    str(files["r.txt"]), "--sources", str(files["s.txt"]), "--metrics",
                                                    "bleu,comet", "--comet_model", str(COMET)]), tmp_path / "changes.json")
        assert code == 0 and changes == [], changes
        assert set(json.loads(capfd.readouterr().out)) >= {"bleu", "comet"}  # what it prints: the scores
    for sig in (signal.SIGKILL, signal.SIGTERM):
        base = tmp_path / signal.Signals(sig).name
        save, tmp = base / "out", base / "t"

        def keep(k: int, status: int) -> None:
            # Killed, or stopped by its handler: the run's one line, exit 130.
            assert (os.WIFSIGNALED(status) and os.WTERMSIG(status) == sig if sig == signal.SIGKILL
                    else os.waitstatus_to_exitcode(status) == 130), (k, status)
            for r in (save, tmp):
                if r.exists():
                    shutil.copytree(r, base / f"{k}" / r.name, symlinks=True)

        steps = _fork_at_each_step(lambda: main([*args, "--save_dir", str(save), "--tmp_dir", str(tmp)]),
                                   [save, tmp], f"/claims/{metric}_", save, sig, keep)
        assert steps >= 4, steps  # a claim, the journal made, a line made durable, ... for each batch
        journaled = []
        for k in range(1, steps + 1):
            out, journal = base / f"{k}" / "out", base / f"{k}" / "t" / "model_scores_rank_0.jsonl"
            lines = journal.read_bytes().count(b"\n") if journal.exists() else 0
            journaled.append(lines)
            assert main([*args, "--save_dir", str(out), "--tmp_dir", str(base / f"{k}" / "t"), "--resume"]) == 0, k
            assert outputs(out) == whole, (sig, k)
            # Each batch scored once: the journaled ones are taken, only the others scored again.
            stats = json.loads((out / "test_bleu.json").read_text())["throughput"]["model_metrics"][metric]
            assert (stats["resumed_batches"], stats["rank0_scored_batches"]) == (lines, stats["batches"] - lines), k
            # The temp dir's files are gone (its folder stays: a copy the run did not make).
            assert leftovers(out) == [] and not [p for p in (base / f"{k}" / "t").rglob("*") if not p.is_dir()], k
        # Stopped before any batch was journaled, between two, and after the last.
        assert journaled[0] == 0 and 0 < journaled[len(journaled) // 2] < stats["batches"] == journaled[-1], journaled


def _changes_made(work: Callable[[], int], report: Path) -> tuple[int, list[list[str]]]:
    """`work` in a forked child with every change to a file or folder anywhere recorded (made,
    opened for writing by os.open or open, renamed, replaced, removed, truncated,
    linked, or made durable by fsync; not a device's): its exit code and the changes."""
    import builtins
    import io

    pid = os.fork()
    if pid:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        changes = json.loads(report.read_text())
        report.unlink()
        return code, changes
    changes: list[list[str]] = []
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    real_open = builtins.open

    def record(name: str, *paths: object) -> None:
        found = [os.path.abspath(p) for p in paths if isinstance(p, (str, bytes, os.PathLike))]
        if found and not all(str(p).startswith("/dev/") for p in found):
            changes.append([name, *map(str, found)])

    def wrap(name: str) -> None:
        real = getattr(os, name)

        def wrapped(*args, **kwargs):
            if name == "fsync":
                fd = args[0] if isinstance(args[0], int) else args[0].fileno()
                record(name, os.readlink(f"/proc/self/fd/{fd}"))
            elif name != "open" or (len(args) > 1 and args[1] & writing):
                record(name, *(args[:2] if name in ("rename", "replace", "link", "symlink") else args[:1]))
            return real(*args, **kwargs)

        setattr(os, name, wrapped)

    def opened(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            record("open", file)
        return real_open(file, mode, *args, **kwargs)

    code = 1
    try:
        for name in ("rename", "replace", "unlink", "rmdir", "mkdir", "open", "fsync", "truncate", "link", "symlink"):
            wrap(name)
        builtins.open = io.open = opened  # pathlib's write_text and write_bytes call io.open
        code = work()
    finally:
        builtins.open = io.open = real_open
        report.write_text(json.dumps(changes))
        sys.stdout.flush()
        os._exit(code)


@pytest.mark.parametrize("environ, tries", [
    ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, True),
    ({"RANK": "5", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, False),
    ({"RANK": "0", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, True),
    ({"SLURM_PROCID": "4", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "8"}, False),
], ids=["rank0", "rank5-local0", "rank0-local3", "srun-rank4-local0"])
def test_only_the_global_rank_0_tries_the_folders_of_a_dry_run(e2e, tmp_path, monkeypatch, environ, tries):
    """Every rank of a torchrun (or srun) dry run runs the checks, on every node; the folders are
    tried by the process whose global rank is 0, whatever its local rank (the first process of
    another node is not rank 0), so that nodes sharing one folder never probe it at once."""
    from seq2seq_eval.run.dist import dist_env
    from seq2seq_eval.run.runner import run

    root, model = e2e
    save = tmp_path / "new" / "save"
    made: list[str] = []
    real = os.mkdir

    def mkdir(path, *args, **kwargs):
        made.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    cfg = EvalConfig(model_name=model, input_path=str(root / "in.txt"), reference_path=str(root / "ref.txt"),
                     save_dir=str(save), task="translation", bs=4, dry_run=True)
    run(cfg, dist_env(environ))
    probes = [p for p in made if ".seq2seq_eval_probe." in p]
    assert sorted({str(Path(p).parent) for p in probes}) == ([str(save), f"{save}_tmp"] if tries else [])
    assert not (tmp_path / "new").exists()  # tried, then removed: a dry run writes nothing
