"""Reading ../shared/realdata (real text and reference-metric vectors beside the checkout) for the
metric tests; a test that needs it is skipped when the folder is not there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
REALDATA = SHARED / "realdata"
WMT17 = REALDATA / "sacrebleu_wmt17_en_de"


def require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not found: real test data lives in ../shared/realdata beside the checkout")
    return path


def read_lines(path: Path) -> list[str]:
    # split("\n"), not splitlines(): WMT text may hold U+2028 or U+0085, which splitlines
    # would treat as line ends and so misalign hypotheses and references.
    text = require(path).read_text(encoding="utf-8")
    if text.endswith("\n"):
        text = text[:-1]
    return text.split("\n")


def json_round_trip(obj):
    """What a rank file does to per-example statistics on the way to rank 0."""
    return json.loads(json.dumps(obj))
