"""The README is a front door and the docs/ pages hold the rest: every relative link and anchor
resolves, the README stays short, and no section that left the README got lost on the way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped,
    spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def outside_code(text: str) -> list[str]:
    lines, in_code = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in outside_code(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6} (.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return found


def links(path: Path) -> list[str]:
    return [m.group(1) for line in outside_code(path.read_text(encoding="utf-8")) for m in LINK.finditer(line)]


@pytest.mark.parametrize("heading, expected", [
    ("Quickstart", "quickstart"),
    ("Per-example results: `{type_path}_examples.jsonl`", "per-example-results-type_path_examplesjsonl"),
    ("When things go wrong, and resuming", "when-things-go-wrong-and-resuming"),
    ("`score` and `compare` over lists", "score-and-compare-over-lists"),
])
def test_slug(heading, expected):
    assert slug(heading) == expected


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_readme_is_a_front_door():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


# Every section the README had before it became a front door, and where it is now.
MOVED = [
    ("Quickstart", "README.md"), ("Usage", "docs/usage.md"), ("Task names", "docs/usage.md"),
    ("The legacy run_eval.py command line", "docs/usage.md"), ("Data", "docs/usage.md"),
    ("Output files", "docs/outputs.md"), ("Metrics", "docs/metrics.md"), ("Which chrF++ is reported", "docs/metrics.md"),
    ("Several references", "docs/metrics.md"), ("Per-example results: `{type_path}_examples.jsonl`", "docs/metrics.md"),
    ("Comparing systems", "docs/compare.md"), ("Python API", "docs/python-api.md"),
    ("With a Trainer: `EvalCallback`", "docs/python-api.md"), ("`score` and `compare` over lists", "docs/python-api.md"),
    ("How it works", "docs/architecture.md"), ("Scale", "docs/scale.md"),
    ("When things go wrong, and resuming", "docs/reliability.md"), ("Troubleshooting", "docs/reliability.md"),
    ("Ecosystem", "docs/ecosystem.md"), ("Hugging Face datasets", "docs/ecosystem.md"),
    ("Multilingual models", "docs/ecosystem.md"), ("Multi-node and SLURM", "docs/ecosystem.md"),
    ("Pseudolabels for distillation", "docs/ecosystem.md"), ("Provenance", "docs/ecosystem.md"),
    ("Embedded model and sample data", "docs/development.md"), ("Performance", "docs/performance.md"),
    ("GPU", "docs/gpu.md"), ("Development", "docs/development.md"), ("Tested checkpoints", "docs/development.md"),
    ("Engines", "docs/engines.md"), ("Work stealing: no rank waits for a slow one", "docs/stealing.md"),
]


@pytest.mark.parametrize("heading, page", MOVED, ids=[h for h, _ in MOVED])
def test_no_section_was_lost(heading, page):
    assert slug(heading) in anchors(REPO / page)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(REPO / "README.md") if t.startswith("docs/")}
    assert sorted(p.name for p in (REPO / "docs").glob("*.md") if p.resolve() not in linked) == []


def test_quickstart_commands_and_ci_agree():
    """The README's two set-up commands are there as a newcomer copies them, and .ci/run runs
    exactly the test command."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    test_command = 'pip install torch==2.13.0 -e ".[test,ctranslate2]" && python -m pytest -q'
    assert "pip install torch==2.13.0 -e . && ./run_eval.sh" in readme and test_command in readme
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == test_command
