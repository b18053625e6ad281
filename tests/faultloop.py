"""The loop over every filesystem step of every kind of command, with every fault (tests/fsfaults.py
numbers the steps and brings the fault). Driven by scripts/fault_loop.py (the whole loop) and
tests/test_fault_loop.py (a sampled subset, in the suite).

For each kind of command (`KINDS`), in a case folder R at a fixed path (the tool writes paths
into its files, so every case runs at the same one):
  1. the folders are seeded with the user's files (some named like the tool's), and the
     `earlier` command leaves its complete set (A); `setup` may then leave a state the command
     meets (journals to resume, a publish cut short);
  2. the command runs once, counted: its operations under R, and its complete set (B); then the
     `other` command (another kind over the same folders) gives C;
  3. for each operation N and each fault (SIGKILL, SIGTERM, EPERM, ENOSPC, EIO at N), from the
     state of 1: the command with the fault; then the same command, the same with --resume, and
     the other kind; each of these under a reader that looks at the folders before each of its
     operations. Checked after each: the user's files unchanged; the folders hold one run's
     complete set (A, B or C, the right one after each command); the tool's files are those its
     record names; every message one line (no traceback) and true of the state; and at the end
     nothing left that needs a hand (an intent, a staging folder, a temporary file, a temp dir).
     A kind whose result is what it prints (`select` without --output) leaves the folders as
     they were: whenever it exits 0, it printed exactly what the clean run printed.
Every failure is a string naming the kind, N, the operation, the fault and what went wrong.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FSFAULTS = HERE / "fsfaults.py"
COMET = HERE / "data" / "comet_tiny" / "wmt22_like"

from fsfaults import FAULTS, normal  # noqa: E402

RECORD, INTENT, STAGING = ".seq2seq_eval_outputs.json", ".seq2seq_eval_publish.json", ".seq2seq_eval_staging"
MARKER = ".seq2seq_eval_tmp"  # a temp dir's marker
# The user's files in every output folder, named like the tool's own (a name the kind writes in
# that folder is left out: the tool would rightly refuse it).
USER_FILES = {"notes.txt": b"my notes\n", "manifest.json": b'{"mine": 1}\n', "rank_0_output.json": b"[1, 2]\n",
              "metrics.json": b'{"bleu": 99.0}\n', "journal_rank_0.jsonl": b'{"batch": 0}\n',
              "pseudolabel_results.json": b"[]\n", "test_bleu.json.bak": b"{}\n"}
USER_STAGED = (STAGING, "notes", "draft.txt")  # a user's folder where the tool stages
COMPLETION = ("test_bleu.json", "metrics.json", "test_run_info.json", "pseudolabel_results.json", "report.html",
              "selections.jsonl")


@dataclass
class Kind:
    """A kind of command: its output folders (relative to R), its temp dir, and the commands, each
    a function of R giving argv (or, for evaluate(), a dict of keyword arguments)."""

    folders: tuple[str, ...]
    earlier: Callable[[Path], Any]
    command: Callable[[Path], Any]
    other: Callable[[Path], Any]
    setup: tuple[Callable[[Path], Any], list] | None = None  # a command and the at_match that kills it
    resumable: bool = True
    prints: bool = False  # its result is what it prints (on success, the clean run's stdout exactly)
    tmp: str = "t"  # its temp dir (relative to R): `select --output`'s default is inside the output folder
    other_folders: tuple[str, ...] = ("s",)  # the folders the other command writes
    floor: int = 10  # the fewest operations this kind must show (a loop that stops finding steps fails)


@dataclass
class Inputs:
    """What the commands read, made once (outside every case folder)."""

    model: Path
    data: dict[str, Path]
    preds: dict[str, Path]
    texts: dict[str, tuple[list[str], list[str]]]


def make_inputs(base: Path, model: Path | None = None) -> Inputs:
    """The data, predictions and (unless given: the tests' tiny_model) the tiny model."""
    from conftest import make_corpus, write_legacy
    from tiny_model import build_tiny_t5

    base.mkdir(parents=True, exist_ok=True)
    if model is None:
        src, tgt = make_corpus(200, seed=1)
        model = base / "model"
        if not (model / "config.json").exists():
            build_tiny_t5(model, src + tgt)
    data, texts = {}, {}
    for name, n, seed in (("a", 6, 47), ("b", 5, 48)):
        s, t = make_corpus(n, seed=seed)
        data[name] = write_legacy(base / f"data_{name}", s, t)
        texts[name] = (s, t)
    samples = json.loads((COMET.parent / "reference_scores.json").read_text())["samples"]
    for name, rows in (("ca", range(0, 3)), ("cb", range(3, 6))):
        path = base / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": i, "source": samples["src"][i], "target": samples["ref"][i]}) + "\n"
                                for i in rows))
        data[name] = path
    # Candidates for `select`: 40 examples of 4 each (two of its batches of 32), in its own shape
    # and in the shape of a run's {type_path}_pseudolabels.jsonl (target and beam scores beside).
    from conftest import WORDS

    for name, seed, own in (("cands_a", 51, True), ("cands_b", 52, True), ("pseudo_b", 53, False)):
        rng = random.Random(seed)
        rows = []
        for i in range(40):
            words = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
            cands = [" ".join(words[:len(words) - k % 2] + [rng.choice(WORDS)] * (k // 2)) for k in range(4)]
            row = {"id": i, "source": " ".join(words), "candidates": cands}
            if not own:
                row = {"id": i, "source": row["source"], "target": [words[0]], "candidates": cands,
                       "scores": [-0.5 * (k + 1) for k in range(4)]}
            rows.append(json.dumps(row) + "\n")
        data[name] = base / f"{name}.jsonl"
        data[name].write_text("".join(rows))
    preds = {}
    for name, words in (("p1", "the cat sat"), ("p2", "a dog runs"), ("ref", "the cat runs")):
        preds[name] = base / f"{name}.txt"
        preds[name].write_text("".join(f"{words} {i}\n" for i in range(5)))
    return Inputs(model, data, preds, texts)


def kinds(inp: Inputs) -> dict[str, Kind]:
    m = str(inp.model)

    def run(data: str, *extra: str) -> Callable[[Path], list[str]]:
        beams = [] if "--num_beams" in extra else ["--num_beams", "1"]
        return lambda r: ["--model_name", m, "--data_dir", str(inp.data[data]), "--save_dir", str(r / "s"),
                          "--tmp_dir", str(r / "t"), "--bs", "4", "--task", "translation", "--max_new_tokens", "4",
                          *beams, *extra]

    def legacy(data: str, out: str, score: str) -> Callable[[Path], list[str]]:
        d = inp.data[data]
        return lambda r: [m, str(d / "test.source"), str(r / out / "preds.txt"), "--reference_path",
                          str(d / "test.target"), "--score_path", str(r / score / "metrics.json"), "--save_dir",
                          str(r / "s"), "--tmp_dir", str(r / "t"), "--bs", "4", "--task", "translation",
                          "--max_new_tokens", "4", "--num_beams", "1"]

    pseudo = ("--num_return_sequences", "2", "--num_beams", "2")
    comet = ("--metrics", "bleu,comet", "--comet_model", str(COMET), "--comet_max_tokens", "40")

    def evaluation(data: str) -> Callable[[Path], dict]:
        s, t = inp.texts[data]
        return lambda r: {"model": m, "sources": s, "references": t, "save_dir": str(r / "s"), "tmp_dir": str(r / "t"),
                          "bs": 4, "metrics": "bleu", "num_beams": 1, "max_new_tokens": 4, "task": "translation"}

    def compare(first: str, second: str) -> Callable[[Path], list[str]]:
        return lambda r: ["compare", "--predictions", str(inp.preds[first]), str(inp.preds[second]), "--references",
                          str(inp.preds["ref"]), "--task", "translation", "--metrics", "bleu", "--n_samples", "20",
                          "--report", str(r / "r" / "report.html")]

    def select(cands: str, *extra: str, output: bool = True) -> Callable[[Path], list[str]]:
        return lambda r: ["select", "--candidates", str(inp.data[cands]), "--select", "mbr", "--select_metric", "chrf",
                          *(["--output", str(r / "o" / "selections.jsonl")] if output else ["--tmp_dir", str(r / "t")]),
                          *extra]

    selecting = ("--num_return_sequences", "4", "--num_beams", "4", "--select", "mbr", "--select_metric", "chrf")

    # The publish cut after its commit point (the intent written, before the first new file is
    # moved in), and generation cut after one batch is journaled.
    in_publish = ["rename", "new/test_generations.txt ->", 1]
    after_one_batch = ["write", "journal_rank_0.jsonl", 2]
    select_in_publish = ["rename", "new/selections.jsonl ->", 1]
    after_one_selection = ["write", "select_rank_0.jsonl", 1]
    # The floors: about 3/4 of the operations each kind made when the loop was written (run 146,
    # resume 114, legacy1 162, legacy2 203, legacy3 244, pseudo 156, comet 156, evaluate 159,
    # compare 41, recovery 185; select 130, select_recovery 166, select_print 46, select_run 177,
    # select_resume 144), so that instrumentation that stops seeing a primitive fails.
    table = {
        "run": Kind(("s",), run("a"), run("b"), run("b", *pseudo)),
        "resume": Kind(("s",), run("a"), lambda r: [*run("b")(r), "--resume"], run("b", *pseudo),
                       setup=(run("b"), after_one_batch)),
        "legacy1": Kind(("s",), legacy("a", "s", "s"), legacy("b", "s", "s"), run("b")),
        "legacy2": Kind(("s", "out"), legacy("a", "out", "out"), legacy("b", "out", "out"), run("b")),
        "legacy3": Kind(("s", "out", "sc"), legacy("a", "out", "sc"), legacy("b", "out", "sc"), run("b")),
        "pseudo": Kind(("s",), run("a", *pseudo), run("b", *pseudo), run("b")),
        "comet": Kind(("s",), run("ca", *comet), run("cb", *comet), run("cb")),
        "evaluate": Kind(("s",), evaluation("a"), evaluation("b"), run("b")),
        "compare": Kind(("r",), compare("p1", "p2"), compare("p2", "p1"), compare("p1", "ref"), resumable=False,
                        other_folders=("r",)),
        "recovery": Kind(("s",), run("a"), run("b"), run("b", *pseudo), setup=(run("b"), in_publish)),
        # `select --output` (its temp dir the default, OUTPUT_tmp, inside the output folder), over
        # its own shape; the other command over a run's pseudolabel file.
        "select": Kind(("o",), select("cands_a"), select("cands_b"), select("pseudo_b"), other_folders=("o",),
                       tmp="o/selections.jsonl_tmp"),
        "select_recovery": Kind(("o",), select("cands_a"), select("cands_b"), select("pseudo_b"), other_folders=("o",),
                                setup=(select("cands_b"), select_in_publish), tmp="o/selections.jsonl_tmp"),
        # `select` printing (its journals in --tmp_dir): the output folder is the earlier
        # selection's and must stay so; what it prints is checked.
        "select_print": Kind(("o",), select("cands_a"), select("cands_b", output=False), select("pseudo_b"),
                             other_folders=("o",), prints=True),
        "select_run": Kind(("s",), run("a", *selecting), run("b", *selecting), run("b", *pseudo)),
        "select_resume": Kind(("s",), run("a", *selecting), lambda r: [*run("b", *selecting)(r), "--resume"],
                              run("b", *pseudo), setup=(run("b", *selecting), after_one_selection)),
    }
    floors = {"run": 110, "resume": 85, "legacy1": 120, "legacy2": 150, "legacy3": 180, "pseudo": 115, "comet": 115,
              "evaluate": 120, "compare": 30, "recovery": 140,
              "select": 95, "select_recovery": 125, "select_print": 35, "select_run": 130, "select_resume": 105}
    for name, kind in table.items():
        kind.floor = floors[name]
    return table


KIND_NAMES = ("run", "resume", "legacy1", "legacy2", "legacy3", "pseudo", "comet", "evaluate", "compare", "recovery",
              "select", "select_recovery", "select_print", "select_run", "select_resume")


# ---------------------------------------------------------------- running one command


@dataclass
class Ran:
    code: int
    err: str
    ops: list[tuple[int, str, str]]
    fault_op: tuple[int, str, str] | None
    violations: list[str]
    out: str = ""


def command(r: Path, what: Any, log: Path, plan: dict | None = None, reader: dict | None = None,
            resume: bool = False, timeout: float = 180) -> Ran:
    """One command (argv, or evaluate()'s keyword arguments) forked from the warm server, under
    fsfaults' instrumentation over R."""
    from conftest import single

    spec: dict[str, Any] = {"roots": [str(r)], "log": str(log), "plan": plan, "reader": reader}
    if isinstance(what, dict):
        spec["evaluate"] = {**what, **({"resume": True} if resume else {})}
        argv: list[str] = []
    else:
        argv = [*what, *(["--resume"] if resume and "--resume" not in what else [])]
    spec_path = log.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    proc = single([str(spec_path), *argv], cwd=r.parent, timeout=timeout, script=FSFAULTS)
    ops, fault, violations = [], None, []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        parts = line.split("\t")
        if parts[0].isdigit():
            ops.append((int(parts[0]), parts[1], parts[2]))
        elif parts[0] == "FAULT":
            fault = (int(parts[2]), parts[3], parts[4])
        elif line.startswith("VIOLATION"):
            violations.append(line)
    return Ran(proc.returncode, proc.stderr, ops, fault, violations, proc.stdout)


# ---------------------------------------------------------------- what a folder holds


def seed_user_files(r: Path, kind: Kind, known: dict[str, set[str]]) -> dict[str, bytes]:
    for f in kind.folders:
        (r / f).mkdir(parents=True, exist_ok=True)
        for name, data in USER_FILES.items():
            if name not in known.get(f, set()):
                (r / f / name).write_bytes(data)
        staged = r / f / Path(*USER_STAGED)
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_bytes(b"the user's draft\n")
    return user_view(r, kind)


def user_view(r: Path, kind: Kind) -> dict[str, bytes]:
    """The user's files (as seeded), by path: compared byte for byte."""
    view = {}
    for f in kind.folders:
        for p in [*(r / f / n for n in USER_FILES), r / f / Path(*USER_STAGED)]:
            if p.is_file():
                view[str(p.relative_to(r))] = p.read_bytes()
    return view


def tool_view(r: Path, kind: Kind, known: dict[str, set[str]]) -> dict[str, dict[str, str]]:
    """Each folder's files of the tool's names (those any complete set has there), normalized."""
    view = {}
    for f in kind.folders:
        view[f] = {}
        for name in sorted(known.get(f, ())):
            p = r / f / name
            if p.is_file():
                view[f][name] = normal(name, p.read_bytes())
    return view


def leftovers(r: Path, kind: Kind, known: dict[str, set[str]], user: dict[str, bytes], keep_tmp: bool) -> list[str]:
    """What needs a hand to remove: an intent, a staging folder (other than the user's own), a
    probe or a temporary file in an output folder, anything in the temp dir (but a resumable
    run's, when `keep_tmp`)."""
    found = []
    for f in kind.folders:
        for p in sorted((r / f).iterdir()) if (r / f).is_dir() else []:
            name = p.name
            if p == r / kind.tmp:
                continue  # the temp dir: below
            if name in known.get(f, set()) or name == RECORD or str(p.relative_to(r)) in user:
                continue
            if name == STAGING:
                extra = [c.name for c in p.iterdir() if c.name != USER_STAGED[1]]
                if extra:
                    found.append(f"{f}/{STAGING}/{','.join(extra)}")
                continue
            found.append(f"{f}/{name}")
    t = r / kind.tmp
    # An empty temp dir is not counted: the tool leaves a folder it did not make (the case's
    # state at the fault may hold one the killed run made), and it blocks nothing.
    left = sorted(str(p.relative_to(r)) for p in t.rglob("*")) if t.exists() and not keep_tmp else []
    if left:
        found.append(f"{kind.tmp}/ ({', '.join(left[:6])})")
    return found


def owned(r: Path, kind: Kind, known: dict[str, set[str]]) -> list[str]:
    """The tool's files its record does not vouch for."""
    from seq2seq_eval.outputs.record import OutputRecord

    bad = []
    for f in kind.folders:
        if not (r / f).is_dir():
            continue
        record = OutputRecord(r / f)
        for name in sorted(known.get(f, ())):
            if (r / f / name).is_file() and not record.owns(r / f / name):
                bad.append(f"{f}/{name}")
    return bad


# ---------------------------------------------------------------- messages


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("seq2seq_eval: error:")]


def one_line(ran: Ran) -> str | None:
    """None when the command's report is right in form: nothing on success, else one
    `seq2seq_eval: error:` line and no traceback."""
    if ran.code == 0 or ran.code < 0:
        return "a traceback on stderr" if "Traceback (most recent call last)" in ran.err else None
    if "Traceback (most recent call last)" in ran.err:
        tail = [line for line in ran.err.splitlines() if line.strip()][-1:]
        return f"exit {ran.code} with a traceback: {tail[0][:300] if tail else ''}"
    lines = error_lines(ran.err)
    if len(lines) != 1:
        return f"exit {ran.code} with {len(lines)} error lines: {ran.err.strip().splitlines()[-1:]}"
    return None


PUBLISHED = re.compile(r"after the outputs were published|the run is complete|were published|publish was completed")
UNCHANGED = re.compile(r"nothing was published|is unchanged|are unchanged|undone|left as they were|as it was")
RECOVERED = re.compile(r"(completing|undoing) the publish of run \S+, cut short")
LEFT = re.compile(r"left for the next command|complete or undo")


# ---------------------------------------------------------------- the loop


@dataclass
class Prepared:
    kind: Kind
    r: Path
    start: Path  # the folders as the command finds them (a copy)
    sets: dict[str, dict[str, dict[str, str]]]  # "A", "B", "C": per folder, name: normal()
    known: dict[str, set[str]]
    user: dict[str, bytes]
    ops: list[tuple[int, str, str]]
    seconds: float
    printed: str = ""  # what the command printed, run whole (a `prints` kind's result)

    @property
    def published_after(self) -> int:
        """The last operation of the command's publish (on an output folder): a fault after it
        meets a run whose outputs are all in place. The temp dir's operations are not the publish's,
        even where the temp dir is inside an output folder."""
        tmp = f"{self.r / self.kind.tmp}"
        if self.kind.prints:
            # What it prints is out once its temp dir's marker says so (renamed into place last).
            return max((n for n, kind, where in self.ops if kind == "rename" and where.endswith(f" -> {tmp}/{MARKER}")),
                       default=0)
        folders = [f"{self.r / f}/" for f in self.kind.folders]
        return max((n for n, _, where in self.ops if any((w.startswith(d) or w == d[:-1]) and not
                                                          (w == tmp or w.startswith(tmp + "/"))
                                                          for d in folders for w in where.split(" -> "))), default=0)


def prepare(name: str, kind: Kind, work: Path, short: bool = False) -> Prepared:
    t0 = time.monotonic()
    r, logs = work / name / "case", work / name / "logs"
    shutil.rmtree(work / name, ignore_errors=True)
    logs.mkdir(parents=True)

    def step(what: Any, label: str, **kw: Any) -> Ran:
        ran = command(r, what(r), logs / f"{label}.log", **kw)
        if ran.code != 0 and not kw.get("plan"):
            raise AssertionError(f"{name}: the {label} command failed (exit {ran.code}):\n{ran.err[-3000:]}")
        return ran

    # The user's files, but none of a name the kind writes in that folder (the tool would rightly
    # refuse it): SCORE_PATH's name, the pseudolabel file.
    argvs = [w for k in (kind.earlier, kind.command, kind.other) for w in [k(r)] if isinstance(w, list)]
    written = {Path(a).name for w in argvs for a in w}
    if any("--num_return_sequences" in w for w in argvs):
        written.add("pseudolabel_results.json")
    r.mkdir(parents=True)
    user = seed_user_files(r, kind, {f: written for f in kind.folders})
    seeded = {f: {Path(k).name for k in user if Path(k).parts[0] == f} for f in kind.folders}
    copies = {}

    def keep(label: str) -> None:
        copies[label] = work / name / label
        shutil.copytree(r, copies[label], symlinks=True)

    step(kind.earlier, "earlier")
    keep("A")
    if kind.setup is not None:
        what, match = kind.setup
        ran = step(what, "setup", plan={"at_match": match, "fault": "kill"})
        assert ran.code == -signal.SIGKILL, f"{name}: the setup was not killed at {match} (exit {ran.code}): {ran.err[-2000:]}"
    keep("start")
    counted = step(kind.command, "count")
    keep("B")
    runs = ("A", "B")
    if not short:  # the other command's set: only the long loop runs it after a case
        step(kind.other, "other")
        keep("C")
        runs = ("A", "B", "C")
    known = {f: {p.name for c in runs if (copies[c] / f).is_dir() for p in (copies[c] / f).iterdir()
                 if p.is_file() and not p.name.startswith(".") and p.name not in seeded[f]} for f in kind.folders}
    sets = {c: tool_view(copies[c], kind, known) for c in runs}
    # A kind that prints its result leaves the folders as they were (A's set is B's): its stdout differs.
    assert (sets["A"] != sets["B"] or kind.prints and counted.out.strip()) and sets.get("C") != sets["B"], \
        f"{name}: the runs' sets do not differ"
    return Prepared(kind, r, copies["start"], sets, known, user, counted.ops, time.monotonic() - t0, counted.out)


@dataclass
class Outcome:
    cases: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_case(p: Prepared, name: str, n: int, fault: str, logs: Path, short: bool = False) -> list[str]:
    """One fault at operation n, then the next commands; what went wrong, as lines. `short`: the
    same command, then --resume only where the same one was refused for it (the suite's budget)."""
    r, kind = p.r, p.kind
    shutil.rmtree(r)
    shutil.copytree(p.start, r, symlinks=True)
    all_sets = {k: {str(r / f): files for f, files in v.items()} for k, v in p.sets.items()}

    def reader(folders: tuple[str, ...]) -> dict:
        return {"folders": [str(r / f) for f in folders], "sets": all_sets, "completion": list(COMPLETION)}

    before = tool_view(r, kind, p.known)
    label = f"{name} op {n} {fault}"
    problems: list[str] = []

    def say(text: str) -> None:
        problems.append(f"{label}{at}: {text}")

    at = ""
    ran = command(r, kind.command(r), logs / "fault.log", plan={"at": n, "fault": fault},
                  reader=reader(kind.folders))
    if ran.fault_op is not None:
        at = f" ({ran.fault_op[1]} {ran.fault_op[2].replace(str(r) + '/', '')})"
    elif fault != "term":
        say(f"the fault was never reached ({len(ran.ops)} operations counted)")
    if ran.violations:
        say(f"reader ({len(ran.violations)} operations): {ran.violations[0].replace(str(r) + '/', '')}")
    bad = one_line(ran)
    if bad:
        say(f"at the fault: {bad}")
    if fault == "kill" and ran.code != -signal.SIGKILL and ran.fault_op is not None:
        say(f"killed, but exit {ran.code}")
    if fault == "term" and ran.code not in (0, 130, -signal.SIGTERM):
        say(f"SIGTERM: exit {ran.code}, expected 130 (or 0): {error_lines(ran.err)[-1:]}")
    if kind.prints and ran.code == 0 and ran.out != p.printed:
        say(f"exit 0, but it printed {len(ran.out.splitlines())} lines, not the {len(p.printed.splitlines())} of a "
            "whole run")
    state = tool_view(r, kind, p.known)
    published = state == p.sets["B"]
    unchanged = state == before
    # A publish cut short by an earlier command, completed or undone first (said in its own
    # line): the folders then hold that publish's set or the one before it, which this command's
    # line need not repeat (the recovery kind: that publish is B's).
    if RECOVERED.search(ran.err) and not unchanged:
        unchanged = published and "completing the publish" in ran.err or state == p.sets["A"]
    intent = any((r / f / INTENT).exists() for f in kind.folders)
    line = (error_lines(ran.err) or [""])[-1]
    if ran.code == 0 and not published:
        whose = {f: [k for k, s in p.sets.items() if s[f] == state[f]] or ["a mix"] for f in kind.folders}
        say(f"exit 0, but the folders do not hold the run's complete set: {whose}")
    if ran.code > 0 or ran.code == 130:
        if PUBLISHED.search(line) and not published:
            say(f"says published, but the folders hold {'what they held' if unchanged else 'a mix'}: {line[:300]}")
        elif UNCHANGED.search(line) and not unchanged and not LEFT.search(line):
            say(f"says nothing changed, but the folders hold {'B' if published else 'a mix'}: {line[:300]}")
        elif LEFT.search(line) and not intent:
            say(f"says a publish was left to complete, but no intent is there: {line[:300]}")
        elif not (PUBLISHED.search(line) or UNCHANGED.search(line) or LEFT.search(line)) and not unchanged:
            say(f"the folders changed ({'to B' if published else 'a mix' + (' with an intent' if intent else '')}) "
                f"and the line does not say so: {line[:300]}")
    # The next commands: the same one, the same with --resume, then another kind.
    nexts = [("same", kind.command, False, "B", kind.folders), ("resume", kind.command, kind.resumable, "B", kind.folders),
             ("other", kind.other, False, "C", kind.other_folders)]
    refused = False
    for step, what, resume, want, folders in nexts:
        if short and (step == "other" or step == "resume" and not refused and name != "resume"):
            continue
        at = f" / then {step}"
        nxt = command(r, what(r), logs / f"{step}.log", reader=reader(folders), resume=resume)
        if nxt.violations:
            say(f"reader ({len(nxt.violations)} operations): {nxt.violations[0].replace(str(r) + '/', '')}")
        bad = one_line(nxt)
        if bad:
            say(bad)
        if nxt.code != 0:
            refused_for_resume = step == "same" and kind.resumable and "--resume" in (error_lines(nxt.err) or [""])[-1]
            if refused_for_resume and n <= p.published_after:
                refused = True
                continue  # a run's journals are there to resume: said in one line, --resume follows
            say(f"exit {nxt.code}: {(error_lines(nxt.err) or nxt.err.strip().splitlines()[-1:] or [''])[-1][:400]}")
            continue
        if kind.prints and step != "other" and nxt.out != p.printed:
            say(f"printed {len(nxt.out.splitlines())} lines, not the {len(p.printed.splitlines())} of a whole run")
        now = tool_view(r, kind, p.known)
        if now != p.sets[want]:
            whose = {f: [k for k, s in p.sets.items() if s[f] == now[f]] or ["a mix"] for f in kind.folders}
            say(f"the folders do not hold {want}'s complete set: {whose}")
        bad_own = owned(r, kind, p.known)
        if bad_own:
            say(f"files the record does not vouch for: {bad_own}")
    at = " / at the end"
    after = user_view(r, kind)
    changed = sorted(k for k in p.user if after.get(k) != p.user[k])
    if changed:
        say(f"user files changed or gone: {changed}")
    left = leftovers(r, kind, p.known, p.user, keep_tmp=False)
    if left:
        say(f"left behind: {left}")
    return problems


def failure_class(failure: str) -> str:
    """A failure without what varies from case to case (the operation's number, pids, tokens,
    paths), so that the failures of one cause count as one class."""
    text = re.sub(r"^\S+ op \d+ ", "", failure)
    text = re.sub(r"^\S+ (\([^)]*\) )?/ then", "then", text)  # a later command's failure: whatever the fault was
    text = re.sub(r"/\S*/case/", "", text)
    text = re.sub(r"\b\d+-[0-9a-f]{8}\b|\.[0-9a-f]{32}\b|\.\d+\.tmp|\.\d+\.[0-9a-f]{8}", "*", text)
    text = re.sub(r"before op \d+|\(\d+ operations\)|\b\d+ journal", "#", text)
    text = re.sub(r"(reader #: VIOLATION # \([a-z]+ [^)]*\)): (.*?) visible beside (an incomplete set|files of two runs).*",
                  r"\1: \2 visible beside \3", text)
    return text[:400]


def select(n_ops: int, sample: int | None, rng: random.Random) -> list[int]:
    """Every operation, or `sample` of them: always the first and the last."""
    every = list(range(1, n_ops + 1))
    if sample is None or sample >= n_ops:
        return every
    middle = rng.sample(every[1:-1], max(0, sample - 2))
    return sorted({1, n_ops, *middle})


def loop(work: Path, names: list[str] | None = None, sample: int | None = None, faults: tuple[str, ...] = FAULTS,
         faults_per_op: int | None = None, seed: int = 0, report: Callable[[str], None] = print,
         inputs: Inputs | None = None, short: bool = False) -> dict[str, Outcome]:
    """The whole loop (or `sample` operations per kind; `faults_per_op` of the faults at each,
    chosen with the seed; `short`: see run_case): the outcome per kind."""
    inp = inputs or make_inputs(work / "inputs")
    table = kinds(inp)
    rng = random.Random(seed)
    outcomes: dict[str, Outcome] = {}
    for name in names or list(table):
        kind = table[name]
        out = outcomes[name] = Outcome()
        try:
            p = prepare(name, kind, work, short)
        except AssertionError as e:
            out.failures.append(f"{name}: preparing: {e}")
            report(f"{name}: preparing failed: {e}")
            continue
        n_ops = len(p.ops)
        if n_ops < kind.floor:
            out.failures.append(f"{name}: {n_ops} operations found, fewer than the floor {kind.floor}")
        t0 = time.monotonic()
        chosen = select(n_ops, sample, rng)
        logs = work / name / "logs"
        for n in chosen:
            tried = faults if faults_per_op is None else tuple(rng.sample(list(faults), min(faults_per_op, len(faults))))
            for fault in tried:
                out.cases += 1
                found = run_case(p, name, n, fault, logs, short)
                out.failures.extend(found)
                for f in found:
                    report(f"FAIL {f}")
        out.seconds = time.monotonic() - t0 + p.seconds
        kinds_count = {k: sum(1 for o in p.ops if o[1] == k) for k in ("create", "write", "fsync", "rename", "unlink",
                                                                        "mkdir", "rmdir")}
        report(f"{name}: {n_ops} operations ({', '.join(f'{k} {v}' for k, v in kinds_count.items())}); "
               f"{len(chosen)} tried x faults = {out.cases} cases, {len(out.failures)} failures, {out.seconds:.0f} s")
    return outcomes
