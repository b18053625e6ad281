"""`python scripts/fault_loop.py [--kinds run legacy3 ...] [--sample K] [--faults kill term ...]`:
every filesystem operation of every kind of command, each with every fault (SIGKILL, SIGTERM,
EPERM, ENOSPC, EIO at it), then the next commands, checked (tests/faultloop.py says what). Prints
each failure as it is found, then per kind the count of operations, of cases and of failures.
`--sample K`: K operations per kind (the first and the last among them), chosen with --seed.
Exits 1 when any case failed."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import conftest  # noqa: E402  (the fork server, the environment the tests' runs get)
from faultloop import failure_class, kinds, loop, make_inputs  # noqa: E402
from fsfaults import FAULTS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", help="the kinds of command (default: all)")
    ap.add_argument("--sample", type=int, help="this many operations per kind (default: every one)")
    ap.add_argument("--faults", nargs="+", default=list(FAULTS), choices=(*FAULTS, "EROFS"))
    ap.add_argument("--faults_per_op", type=int, help="this many of the faults at each operation, at random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", help="where the cases run (default: a new temporary folder)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="s2s_fault_loop_"))
    print(f"working in {work}", flush=True)
    t0 = time.monotonic()
    try:
        inp = make_inputs(work / "inputs")
        names = args.kinds or list(kinds(inp))
        outcomes = loop(work, names, args.sample, tuple(args.faults), args.faults_per_op, args.seed,
                        report=lambda s: print(s, flush=True), inputs=inp)
    finally:
        for server in conftest._FORK_SERVER:
            server.close()
    classes: dict[str, list[str]] = {}
    for name, o in outcomes.items():
        for f in o.failures:
            classes.setdefault(f"{name}: {failure_class(f)}", []).append(f)
    print("\nfailures by class (count, class, first case):")
    for c, found in sorted(classes.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(found):5d}  {c}\n       e.g. {found[0][:300]}")
    cases = sum(o.cases for o in outcomes.values())
    failures = sum(len(o.failures) for o in outcomes.values())
    print(f"total: {len(outcomes)} kinds, {cases} cases, {failures} failures, {time.monotonic() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
