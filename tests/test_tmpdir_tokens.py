"""The temp dir is the tool's by a token it wrote, never by a name (run/tmpdir.py): its marker is
written whole, with the folder's token and the run's, in one step; a marker without them, or a
manifest that does not carry the folder's token, is a user's; what a kill leaves half made (the
marker's temporary file) is known by its token and cleared; a run whose outputs were published
leaves a folder the next command clears, never one it refuses. The names the publish uses in an
output folder are checked before any work (the dry run too), and the legacy form's hidden folder
is named as such. All in-process, without a model."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from seq2seq_eval.config import EvalConfig
from seq2seq_eval.errors import OutputError, RunStateError
from seq2seq_eval.legacy import build_legacy
from seq2seq_eval.outputs.locations import check_output_locations, try_folders
from seq2seq_eval.outputs.record import INTENT, RECORD, STAGING
from seq2seq_eval.run import tmpdir, tmpmarker
from seq2seq_eval.run.journal import Journal, journal_file


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def a_run(tmp: Path) -> str:
    """What a run leaves in its temp dir once it has journaled a batch: marker, manifest, a journal."""
    tmpdir.claim_tmp_dir(tmp)
    token = tmpdir.new_token(tmp)
    tmpdir.prepare_tmp_dir(tmp, {"model": 1, "data": 2, "plan": {"bs": 4, "max_tokens": None}, "generation": 3}, False)
    journal = Journal(journal_file(tmp, 0))
    journal.append({"batch": 0, "records": [], "seconds": 0.1})
    journal.close()
    return token


@pytest.mark.parametrize("marker", [
    {"tool": "seq2seq_eval"},  # the tool's name and nothing else: what an earlier release wrote first
    {"tool": "seq2seq_eval", "made": [], "token": secrets.token_hex(16)},  # a run token without the folder's
    {"tool": "seq2seq_eval", "folder": "not a token", "token": secrets.token_hex(16)},
    {"tool": "seq2seq_eval", "folder": secrets.token_hex(16), "token": 7},
])
def test_a_marker_without_the_tools_tokens_makes_nothing_the_tools(tmp_path, marker):
    """A folder holding a marker with the tool's name but not its tokens, beside files named like
    the tool's: refused in one line, in the dry run and the run, and nothing there is touched."""
    tmp = tmp_path / "scratch"
    tmp.mkdir()
    (tmp / tmpdir.MARKER).write_text(json.dumps(marker))
    for name in ("manifest.json", "rank_0_output.json", "journal_rank_0.jsonl", "run.lock"):
        (tmp / name).write_text(f"the user's {name}\n")
    before = files(tmp)
    for create in (False, True):
        with pytest.raises(RunStateError, match="marker without the tokens seq2seq_eval writes") as e:
            tmpdir.claim_tmp_dir(tmp, create=create)
        assert "\n" not in str(e.value)
    tmpdir.cleanup_tmp_dir(tmp)  # nor does a cleanup take it for the tool's
    assert files(tmp) == before


def test_a_marker_copied_beside_a_users_manifest_is_refused(tmp_path):
    """A real marker of the tool's copied into a folder whose manifest.json is not that folder's
    (no, or another, folder token): refused, nothing read or removed; the folder's own run is fine."""
    first, second = tmp_path / "a", tmp_path / "b"
    a_run(first)
    second.mkdir()
    (second / tmpdir.MARKER).write_bytes((first / tmpdir.MARKER).read_bytes())
    (second / "manifest.json").write_text(json.dumps({"model": 1, "data": 2, "plan": {}, "generation": 3}))
    with pytest.raises(RunStateError, match="manifest.json does not carry the token of the folder's"):
        tmpdir.claim_tmp_dir(second)
    tmpdir.cleanup_tmp_dir(second)
    assert (second / "manifest.json").exists()
    tmpdir.claim_tmp_dir(first)  # its own manifest carries its token


@pytest.mark.parametrize("content", ["empty", "whole"])
def test_a_marker_half_made_by_a_kill_is_cleared_by_the_next_command(tmp_path, content):
    """Killed between the marker's temporary file and its rename: the folder holds only that file,
    named by the folder token. The next command (the dry run says nothing against it) takes the
    folder, the half-made marker goes, and the parents that first claim made are still known."""
    tmp = tmp_path / "new" / "scratch"
    token = secrets.token_hex(16)
    tmp.mkdir(parents=True)
    marker = {"tool": "seq2seq_eval", "folder": token, "token": secrets.token_hex(16), "made": [str(tmp_path / "new"), str(tmp)]}
    (tmp / f"{tmpdir.MARKER}.{token}.tmp").write_text("" if content == "empty" else json.dumps(marker))
    tmpdir.claim_tmp_dir(tmp, create=False)
    tmpdir.claim_tmp_dir(tmp)
    assert sorted(os.listdir(tmp)) == [tmpdir.MARKER]
    tmpdir.cleanup_tmp_dir(tmp)
    if content == "whole":
        assert not (tmp_path / "new").exists()  # the folders the first claim made go with it
    else:  # killed before a byte was written: which folders it made is not known, and they stay, empty
        assert tmp.is_dir() and not os.listdir(tmp)


def test_a_file_named_like_a_half_made_marker_but_not_one_is_the_users(tmp_path):
    """The same name with content that is no marker of that token: the user's file, refused."""
    tmp = tmp_path / "scratch"
    tmp.mkdir()
    token = secrets.token_hex(16)
    (tmp / f"{tmpdir.MARKER}.{token}.tmp").write_text(json.dumps({"folder": secrets.token_hex(16)}))
    with pytest.raises(RunStateError, match="but no .seq2seq_eval_tmp marker"):
        tmpdir.claim_tmp_dir(tmp)
    assert len(os.listdir(tmp)) == 1


def test_a_published_runs_leftovers_are_cleared_not_refused(tmp_path):
    """A run marks its temp dir published once its outputs are in place, before it removes its
    files there: killed while removing them, the next plain run is not refused (no --resume asked),
    and takes the folder clean; a run that did not publish still is refused without --resume."""
    tmp = tmp_path / "scratch"
    token = a_run(tmp)
    with pytest.raises(RunStateError, match="pass --resume"):
        tmpdir.refuse_earlier_run(tmp, resume=False)
    tmpmarker.mark_published(tmp, "f" * 32)  # another run's token: nothing said
    with pytest.raises(RunStateError, match="pass --resume"):
        tmpdir.refuse_earlier_run(tmp, resume=False)
    tmpmarker.mark_published(tmp, token)
    tmpdir.claim_tmp_dir(tmp)
    tmpdir.refuse_earlier_run(tmp, resume=False)
    lock = tmpdir.RunLock(tmp)
    lock.acquire()
    tmpdir.new_token(tmp)
    lock.release()
    assert sorted(os.listdir(tmp)) == [tmpdir.MARKER, tmpdir.LOCK]
    assert not tmpdir.read_marker(tmp).get("published")


@pytest.mark.parametrize("name, make", [
    (STAGING, lambda p: p.symlink_to("/tmp")),
    (STAGING, lambda p: p.write_text("mine")),
    (RECORD, lambda p: p.mkdir()),
    (RECORD, lambda p: p.symlink_to("/etc/hostname")),
    (INTENT, lambda p: p.mkdir()),
])
def test_the_names_the_publish_uses_are_checked_before_any_work(tmp_path, name, make):
    """A link, a file or a folder where the publish keeps its staging folder, record or intent:
    one line from the checks every run (and the dry run) makes first, not after generation."""
    save = tmp_path / "out"
    save.mkdir()
    make(save / name)
    cfg = EvalConfig(model_name="m", data_dir=str(tmp_path), save_dir=str(save))
    with pytest.raises(OutputError, match=f"{name} is a (link|file|folder), where seq2seq_eval keeps its own") as e:
        try_folders(cfg)
    assert "\n" not in str(e.value)


def test_the_legacy_forms_hidden_folder_is_named_as_such(tmp_path):
    """Without --save_dir, the legacy form's outputs go to SAVE_PATH's hidden folder: a file of
    the user's there is refused naming that folder and SAVE_PATH, never a --save_dir not given."""
    (tmp_path / "in.txt").write_text("a\n")
    save_path = tmp_path / "out" / "preds.txt"
    hidden = tmp_path / "out" / ".preds.txt.seq2seq_eval"
    hidden.mkdir(parents=True)
    (hidden / "test_generations.txt").write_text("mine\n")
    cfg, _ = build_legacy(["m", str(tmp_path / "in.txt"), str(save_path)])
    with pytest.raises(OutputError) as e:
        check_output_locations(cfg)
    assert f"the hidden folder of SAVE_PATH {save_path}" in str(e.value) and "name another SAVE_PATH" in str(e.value)
    assert "--save_dir" not in str(e.value)


def test_journal_lines_carry_the_temp_dirs_token_and_others_are_not_read(tmp_path):
    """Each journal line carries its temp dir's token, and the run lock says it too: a journal
    copied in from another temp dir (its lines another folder's) is not resumed from, while the
    folder's own lines are."""
    from seq2seq_eval.run.journal import JournalIndex

    first, second = tmp_path / "a", tmp_path / "b"
    a_run(first)
    a_run(second)
    own = json.loads((second / "journal_rank_0.jsonl").read_text().splitlines()[0])
    assert own["tmp"] == tmpmarker.folder_token(second) != tmpmarker.folder_token(first)
    assert JournalIndex(second).finished() == {0}
    (second / "journal_rank_0.jsonl").write_bytes((first / "journal_rank_0.jsonl").read_bytes())
    assert JournalIndex(second).finished() == set()
    lock = tmpdir.RunLock(second)
    lock.acquire()
    assert tmpmarker.folder_token(second) in (second / tmpdir.LOCK).read_text()
    lock.release()
