"""The HTML report of ``seq2seq_eval compare``: one self-contained page, no network, no script.

Charts are inline SVG drawn here (grouped bars), so the page needs no plotting library and
renders the same anywhere. Everything the page shows is computed by ``compare.compare_systems``
and ``compare.report_details``; this module only formats it. The output is a pure function of
its inputs (no dates, no random ids), so the same comparison gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from .paired import lower_is_better
from .table import describe_test, table_rows

__all__ = ["PALETTE", "bar_chart", "render_report"]

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C6D31", "#000000")
"""Okabe-Ito colours (distinguishable with colour-blindness), cycled over the systems."""

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f;
       max-width: 1180px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta, .note { color: #555; margin: 4px 0; }
table.results { border-collapse: collapse; margin: 8px 0; }
table.results th, table.results td { padding: 3px 12px; border-bottom: 1px solid #e5e5e5; text-align: left; }
table.results td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.results tr.sig td { font-weight: 600; } table.results tr.first td { border-top: 2px solid #bbb; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 6px 0; }
.legend span.sw { display: inline-block; width: 12px; height: 12px; margin-right: 5px; vertical-align: -1px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 12px; }
figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: 2px; }
svg.chart { width: 100%; height: auto; }
.ex { border: 1px solid #ddd; border-radius: 6px; padding: 8px 10px; margin: 8px 0; }
.ex .head { font-weight: 600; margin-bottom: 4px; } .better { color: #0a7a32; } .worse { color: #b3261e; }
.ex .grid { display: grid; grid-template-columns: 1fr 1fr; gap: 6px 12px; }
.ex .wide { grid-column: 1 / 3; } .ex .label { color: #555; font-size: 12px; }
.ex .grid > div { min-width: 0; }
.ex .text { white-space: pre-wrap; overflow-wrap: anywhere; min-width: 0; max-height: 11em; overflow: auto;
            background: #f7f7f8; padding: 4px 6px; border-radius: 4px; }
dl.sig dt { font-weight: 600; } dl.sig dd { margin: 0 0 6px 16px; font-family: ui-monospace, monospace; font-size: 12px; }
"""


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= raw:
            return m * magnitude
    return 10 * magnitude


def bar_chart(
    chart_id: str,
    categories: Sequence[tuple[str, str]],
    series: Sequence[tuple[str, Sequence[float]]],
    y_label: str,
    x_label: str,
) -> str:
    """Grouped bars as inline SVG: one group per category ((label, second line)), one bar per
    series (name, values), coloured by PALETTE in series order. Each bar has a <title> tooltip."""
    width, height = 560, 290
    left, right, top, bottom = 52, 10, 12, 58
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((v for _, values in series for v in values), default=0.0)
    step = _nice_step(peak if peak > 0 else 1.0)
    y_max = step * max(1, math.ceil(peak / step - 1e-9))

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_max)

    out = [
        f'<svg class="chart" data-chart="{escape(chart_id)}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(y_label)} by {escape(x_label)}" '
        'font-family="system-ui, sans-serif" font-size="11">'
    ]
    k = 0
    while k * step <= y_max + 1e-9:
        v = k * step
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e3e3e3"/>')
        label = f"{v:g}" if step >= 1 else f"{v:.2g}"
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#444">{label}</text>')
        k += 1
    group = plot_w / max(1, len(categories))
    bar = group * 0.8 / max(1, len(series))
    for c, (label, sub) in enumerate(categories):
        x0 = left + c * group + group * 0.1
        for s, (name, values) in enumerate(series):
            v = values[c]
            h = max(0.0, plot_h * v / y_max)
            out.append(
                f'<rect x="{x0 + s * bar:.1f}" y="{top + plot_h - h:.1f}" width="{max(bar - 1, 1):.1f}" '
                f'height="{h:.1f}" fill="{PALETTE[s % len(PALETTE)]}"><title>{escape(name)}, {escape(label)}: '
                f"{v:.2f}</title></rect>"
            )
        cx = left + (c + 0.5) * group
        out.append(f'<text x="{cx:.1f}" y="{top + plot_h + 15}" text-anchor="middle" fill="#222">{escape(label)}</text>')
        if sub:
            out.append(f'<text x="{cx:.1f}" y="{top + plot_h + 28}" text-anchor="middle" fill="#777">{escape(sub)}</text>')
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#444"/>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#444"/>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 8}" text-anchor="middle" fill="#222">{escape(x_label)}</text>')
    out.append(
        f'<text transform="translate(13 {top + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle" fill="#222">'
        f"{escape(y_label)}</text>"
    )
    out.append("</svg>")
    return "".join(out)


def _legend(names: Sequence[str]) -> str:
    items = "".join(
        f'<span><span class="sw" style="background:{PALETTE[i % len(PALETTE)]}"></span>{escape(n)}</span>'
        for i, n in enumerate(names)
    )
    return f'<div class="legend">{items}</div>'


def _results_table(comparison: Mapping[str, Any]) -> str:
    out = ['<table class="results"><thead><tr><th>system</th><th>metric</th><th>score</th><th>95% interval</th>'
           "<th>p-value</th><th></th></tr></thead><tbody>"]
    previous = None
    for name, metric, score, ci, p, mark in table_rows(comparison):
        classes = [c for c, on in (("sig", bool(mark)), ("first", previous is not None and metric != previous)) if on]
        cls = f' class="{" ".join(classes)}"' if classes else ""
        out.append(
            f"<tr{cls}><td>{escape(name)}</td><td>{escape(metric)}</td><td class=num>{score}</td>"
            f"<td class=num>{escape(ci)}</td><td class=num>{escape(p)}</td><td>{mark}</td></tr>"
        )
        previous = metric
    out.append("</tbody></table>")
    return "".join(out)


def _example(ex: Mapping[str, Any], base: str, name: str, metric: str) -> str:
    better = ex["delta"] < 0 if lower_is_better(metric) else ex["delta"] > 0
    cls = "better" if better else "worse" if ex["delta"] != 0 else ""
    head = (
        f'<div class="head">id {escape(str(ex["id"]))} · <span class="{cls}">{metric} {ex["delta"]:+.2f}</span> '
        f'({_fmt(ex["baseline_score"])} → {_fmt(ex["system_score"])})</div>'
    )

    def cell(label: str, text: str, wide: bool = False) -> str:
        return (f'<div class="{"wide" if wide else ""}"><div class="label">{escape(label)}</div>'
                f'<div class="text">{escape(text)}</div></div>')

    cells = []
    if ex["source"] is not None:
        cells.append(cell("source", ex["source"], wide=True))
    for k, ref in enumerate(ex["references"]):
        cells.append(cell("reference" if len(ex["references"]) == 1 else f"reference {k + 1}", ref, wide=True))
    cells.append(cell(f"baseline: {base}", ex["baseline"]))
    cells.append(cell(name, ex["system"]))
    return f'<div class="ex">{head}<div class="grid">{"".join(cells)}</div></div>'


GENERATOR = "seq2seq_eval compare"
"""Marks a report as the tool's: `compare --report` writes over an existing file only if it has it."""


def render_report(comparison: Mapping[str, Any], details: Mapping[str, Any]) -> str:
    """The whole page, as a string."""
    names = list(comparison["systems"])
    metrics = list(comparison["metrics"])
    base = comparison["baseline"]
    basis = details["length_basis"]
    categories = [(b["label"], f"n={b['n']}") for b in details["buckets"]]
    has_rouge = any(m.startswith("rouge") for m in metrics)
    body = [
        f"<h1>Comparing {len(names)} systems</h1>",
        f'<p class="meta">{escape(describe_test(comparison))}</p>',
        '<section id="results"><h2>Scores and paired tests</h2>',
        _results_table(comparison),
        f'<p class="note">* p &lt; {comparison["alpha"]}: significantly different from the baseline. The 95% interval is '
        "sacrebleu's: the mean of the bootstrap scores ± half the spread between the 2.5% and 97.5% ones."
        + (" ROUGE scores are mean per-example F-measures, tested over per-example scores." if has_rouge else "")
        + "</p></section>",
        '<section id="buckets"><h2>Score by length</h2>',
    ]
    if basis == "source":
        body.append('<p class="note">Buckets: quintiles of the source length (whitespace tokens); '
                    "each bar is the system's corpus score on the bucket's examples.</p>")
    else:
        body.append('<p class="note"><strong>No sources were given</strong> (pass --sources, or compare run folders): '
                    f"buckets are quintiles of the <strong>{'reference' if basis == 'reference' else 'baseline prediction'}"
                    "</strong> length (whitespace tokens) instead.</p>")
    body.append(_legend(names) + '<div class="charts">')
    x_label = f"{basis} length (tokens)"
    for metric in metrics:
        series = [(n, details["bucket_scores"][metric][n]) for n in names]
        body.append(f"<figure><figcaption>{escape(metric)} by {basis} length</figcaption>"
                    f"{bar_chart(f'buckets-{metric}', categories, series, metric, x_label)}</figure>")
    body.append("</div></section>")
    notes = ["bleu: sacrebleu's sentence BLEU, with effective order"] if "bleu" in metrics else []
    notes += ["ter above 100 counts in the last bin"] if "ter" in metrics else []
    body.append('<section id="distribution"><h2>Sentence-score distribution</h2>'
                f'<p class="note">Share of examples per sentence-score bin{" (" + "; ".join(notes) + ")" if notes else ""}.</p>'
                + _legend(names) + '<div class="charts">')
    for metric in metrics:
        hist = details["histograms"][metric]
        series = [(n, hist["percent"][n]) for n in names]
        body.append(f"<figure><figcaption>sentence {escape(metric)}</figcaption>"
                    f"{bar_chart(f'dist-{metric}', [(b, '') for b in hist['bins']], series, '% of examples', f'sentence {metric}')}"
                    "</figure>")
    body.append("</div></section>")
    primary = details["primary_metric"]
    body.append(f'<section id="examples"><h2>Largest per-example differences (sentence {escape(primary)})</h2>')
    for name in names[1:]:
        body.append(f"<h3>{escape(name)} vs the baseline {escape(base)}</h3>")
        body.extend(_example(ex, base, name, primary) for ex in details["examples"][name])
    body.append("</section>")
    sigs = "".join(f"<dt>{escape(m)}</dt><dd>{escape(s)}</dd>" for m, s in comparison["signatures"].items())
    body.append(f'<section id="signatures"><h2>Signatures</h2><dl class="sig">{sigs}</dl></section>')
    title = f"Comparison: {', '.join(names)}"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="generator" content="{GENERATOR}">'
        f'<title>{escape(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>\n'
        f"<body>\n{chr(10).join(body)}\n</body></html>\n"
    )
