"""One report for a sweep: cells by metrics with 95% intervals, pass@k curves, and paired
comparisons with a baseline cell on the examples both share, as JSON, Markdown and a
self-contained HTML page (inline SVG, no script, no network).

Numbers come from the cells' files: each metric's mean and interval from the cell's
`scores.json` (per-example means, normal approximation), and the paired comparisons from
the cells' rows: per example, the mean score in each cell; the difference's mean, a 95%
paired-bootstrap interval and p-value (10,000 resamples of the examples, seeded, so the
report is reproducible), and the exact two-sided sign test.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

BOOTSTRAP = 10_000
SEED = 20261201


def cell_example_means(run: Path, metric: str) -> dict[str, float]:
    """Per example id, the mean of score_<metric> over its samples (null scores left out)."""
    sums: dict[str, list[float]] = {}
    for path in sorted((run / "data").glob("*.parquet")):
        names = pq.ParquetFile(path).schema_arrow.names
        if f"score_{metric}" not in names:
            continue
        table = pq.read_table(path, columns=["example_id", f"score_{metric}"])
        for ex, v in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
            if v is not None:
                sums.setdefault(ex, []).append(v)
    return {ex: math.fsum(v) / len(v) for ex, v in sums.items()}


def sign_test(plus: int, minus: int) -> float:
    """Exact two-sided sign test p-value (ties dropped before)."""
    n = plus + minus
    if n == 0:
        return 1.0
    k = min(plus, minus)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(base: dict[str, float], other: dict[str, float]) -> dict[str, Any]:
    """The comparison of `other` with `base` on the examples both have."""
    common = sorted(set(base) & set(other))
    if not common:
        return {"examples": 0}
    d = np.array([other[e] - base[e] for e in common], dtype=np.float64)
    rng = np.random.default_rng(SEED)
    boots = d[rng.integers(0, len(d), size=(BOOTSTRAP, len(d)))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    p_boot = min(1.0, 2 * min(float((boots <= 0).mean()), float((boots >= 0).mean())))
    plus, minus = int((d > 0).sum()), int((d < 0).sum())
    return {
        "examples": len(common), "mean_diff": float(d.mean()), "ci95": [float(lo), float(hi)],
        "p_bootstrap": p_boot, "sign_test": {"plus": plus, "minus": minus,
        "ties": len(common) - plus - minus, "p": sign_test(plus, minus)},
    }  # fmt: skip


def build_report(output: Path, sweep: dict[str, Any], baseline: str | None) -> dict[str, Any]:
    cells = []
    metrics: list[str] = []
    for c in sweep["cells"]:
        run = output / "cells" / c["cell_id"]
        scores_path = run / "scores.json"
        scores = json.loads(scores_path.read_text()) if scores_path.exists() else {"metrics": {}}
        for name in scores["metrics"]:
            if name not in metrics:
                metrics.append(name)
        cells.append({k: c[k] for k in ("cell_id", "settings", "config_hash", "run_digest", "score_digest", "rows", "rows_generated", "rows_cached")} | {"metrics": scores["metrics"]})  # fmt: skip
    comparisons = []
    if baseline is not None:
        for metric in metrics:
            base = cell_example_means(output / "cells" / baseline, metric)
            for c in cells:
                if c["cell_id"] == baseline or metric not in c["metrics"]:
                    continue
                other = cell_example_means(output / "cells" / c["cell_id"], metric)
                comparisons.append({"cell": c["cell_id"], "baseline": baseline, "metric": metric} | paired(base, other))  # fmt: skip
    return {
        "version": "rollout-sweep-report-v1", "sweep": sweep["name"], "digest": sweep.get("digest", ""),
        "baseline": baseline, "metrics": metrics, "cells": cells, "comparisons": comparisons,
        "rows_generated": sum(c["rows_generated"] for c in cells),
        "rows_cached": sum(c["rows_cached"] for c in cells),
        "method": "means over examples with 95% normal intervals (scores.json); paired comparisons: "
                  f"{BOOTSTRAP} bootstrap resamples of the shared examples (seed {SEED}) and the exact sign test",
    }  # fmt: skip


def _fmt(m: dict[str, Any] | None) -> str:
    if not m or m.get("mean") is None:
        return "-"
    ci = m.get("ci95")
    return f"{m['mean']:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")


def _pass_ks(report: dict[str, Any], metric: str) -> list[str]:
    ks: set[str] = set()
    for c in report["cells"]:
        ks |= set(c["metrics"].get(metric, {}).get("pass_at_k", {}))
    return sorted(ks, key=int)


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Sweep {report['sweep']}", "",
             f"{len(report['cells'])} cells; rows generated {report['rows_generated']}, from the cache "
             f"{report['rows_cached']}; digest `{report['digest']}`.", "",
             "| cell | " + " | ".join(report["metrics"]) + " |",
             "| --- |" + " ---: |" * len(report["metrics"])]  # fmt: skip
    for c in report["cells"]:
        lines.append(f"| {c['cell_id']} | " + " | ".join(_fmt(c["metrics"].get(m)) for m in report["metrics"]) + " |")  # fmt: skip
    for metric in report["metrics"]:
        ks = _pass_ks(report, metric)
        if not ks:
            continue
        lines += ["", f"pass@k of {metric}:", "", "| cell | " + " | ".join(f"pass@{k}" for k in ks) + " |",
                  "| --- |" + " ---: |" * len(ks)]  # fmt: skip
        for c in report["cells"]:
            p = c["metrics"].get(metric, {}).get("pass_at_k", {})
            lines.append(f"| {c['cell_id']} | " + " | ".join(_fmt(p.get(k)) for k in ks) + " |")
    if report["comparisons"]:
        lines += ["", f"Paired with the baseline `{report['baseline']}` on the examples both have:", "",
                  "| cell | metric | examples | mean difference [95% CI] | p (bootstrap) | sign test +/-/= | p (sign) |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for x in report["comparisons"]:
            if not x["examples"]:
                continue
            s = x["sign_test"]
            lines.append(f"| {x['cell']} | {x['metric']} | {x['examples']} | {x['mean_diff']:+.4f} [{x['ci95'][0]:+.4f}, {x['ci95'][1]:+.4f}] | {x['p_bootstrap']:.4f} | {s['plus']}/{s['minus']}/{s['ties']} | {s['p']:.4f} |")  # fmt: skip
    lines += ["", f"Method: {report['method']}."]
    return "\n".join(lines) + "\n"


_COLORS = ["#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5"]


def _bars_svg(report: dict[str, Any], metric: str) -> str:
    cells = [c for c in report["cells"] if c["metrics"].get(metric, {}).get("mean") is not None]
    if not cells:
        return ""
    lows = [min(c["metrics"][metric]["mean"], *(c["metrics"][metric].get("ci95") or [c["metrics"][metric]["mean"]])) for c in cells]  # fmt: skip
    highs = [max(c["metrics"][metric]["mean"], *(c["metrics"][metric].get("ci95") or [c["metrics"][metric]["mean"]])) for c in cells]  # fmt: skip
    lo, hi = min(0.0, *lows), max(0.0, *highs)
    hi = hi if hi > lo else lo + 1
    width, row, left = 720, 26, 300
    height = row * len(cells) + 30

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (width - left - 20)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{html.escape(metric)} by cell">',
             f'<line x1="{x(0):.1f}" y1="0" x2="{x(0):.1f}" y2="{height - 20}" stroke="#999"/>']  # fmt: skip
    for i, c in enumerate(cells):
        m = c["metrics"][metric]
        y = i * row + 4
        parts.append(f'<text x="{left - 8}" y="{y + 14}" text-anchor="end" font-size="12">{html.escape(c["cell_id"][:46])}</text>')  # fmt: skip
        x0, x1 = sorted((x(0), x(m["mean"])))
        parts.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="18" fill="{_COLORS[i % len(_COLORS)]}"><title>{html.escape(_fmt(m))}</title></rect>')  # fmt: skip
        if m.get("ci95"):
            a, b = x(m["ci95"][0]), x(m["ci95"][1])
            parts.append(f'<line x1="{a:.1f}" y1="{y + 9}" x2="{b:.1f}" y2="{y + 9}" stroke="#222" stroke-width="1.5"/><line x1="{a:.1f}" y1="{y + 4}" x2="{a:.1f}" y2="{y + 14}" stroke="#222"/><line x1="{b:.1f}" y1="{y + 4}" x2="{b:.1f}" y2="{y + 14}" stroke="#222"/>')  # fmt: skip
    parts.append(f'<text x="{x(lo):.1f}" y="{height - 5}" font-size="11">{lo:.3g}</text><text x="{x(hi):.1f}" y="{height - 5}" font-size="11" text-anchor="end">{hi:.3g}</text></svg>')  # fmt: skip
    return "".join(parts)


def _passk_svg(report: dict[str, Any], metric: str) -> str:
    ks = _pass_ks(report, metric)
    if len(ks) < 2:
        return ""
    width, height, pad = 720, 260, 40
    kmax = max(int(k) for k in ks)

    def px(k: int) -> float:
        return pad + (math.log2(k) / max(math.log2(kmax), 1)) * (width - 2 * pad - 200)

    def py(v: float) -> float:
        return height - pad - v * (height - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="pass@k of {html.escape(metric)}">',
             f'<line x1="{pad}" y1="{py(0)}" x2="{width - 200 - pad}" y2="{py(0)}" stroke="#999"/><line x1="{pad}" y1="{py(0)}" x2="{pad}" y2="{py(1)}" stroke="#999"/>',
             f'<text x="{pad - 6}" y="{py(1) + 4}" font-size="11" text-anchor="end">1</text><text x="{pad - 6}" y="{py(0) + 4}" font-size="11" text-anchor="end">0</text>']  # fmt: skip
    for k in ks:
        parts.append(f'<text x="{px(int(k)):.1f}" y="{height - pad + 16}" font-size="11" text-anchor="middle">k={k}</text>')  # fmt: skip
    for i, c in enumerate(report["cells"]):
        p = c["metrics"].get(metric, {}).get("pass_at_k", {})
        pts = [(px(int(k)), py(p[k]["mean"])) for k in ks if k in p and p[k]["mean"] is not None]
        if not pts:
            continue
        color = _COLORS[i % len(_COLORS)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}"/>')  # fmt: skip
        parts += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>' for a, b in pts]
        parts.append(f'<text x="{width - 190}" y="{pad + 16 * i}" font-size="11" fill="{color}">{html.escape(c["cell_id"][:30])}</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def render_html(report: dict[str, Any]) -> str:
    md_rows = "".join(
        "<tr><td>"
        + html.escape(c["cell_id"])
        + "</td>"
        + "".join(f"<td>{html.escape(_fmt(c['metrics'].get(m)))}</td>" for m in report["metrics"])
        + f"<td>{c['rows_generated']}</td><td>{c['rows_cached']}</td></tr>"  # fmt: skip
        for c in report["cells"]
    )
    sections = []
    for metric in report["metrics"]:
        sections.append(f"<h2>{html.escape(metric)}</h2><p>mean over examples, 95% interval</p>{_bars_svg(report, metric)}")  # fmt: skip
        ks = _pass_ks(report, metric)
        if ks:
            head_k = "".join(f"<th>pass@{k}</th>" for k in ks)
            body_k = "".join(
                f"<tr><td>{html.escape(c['cell_id'])}</td>"
                + "".join(
                    f"<td>{html.escape(_fmt(c['metrics'].get(metric, {}).get('pass_at_k', {}).get(k)))}</td>"
                    for k in ks
                )
                + "</tr>"  # fmt: skip
                for c in report["cells"]
            )
            sections.append(f"<h3>pass@k of {html.escape(metric)}</h3>{_passk_svg(report, metric)}<table><tr><th>cell</th>{head_k}</tr>{body_k}</table>")  # fmt: skip
    comp = ""
    if report["comparisons"]:
        rows = "".join(
            f"<tr><td>{html.escape(x['cell'])}</td><td>{html.escape(x['metric'])}</td><td>{x['examples']}</td><td>{x['mean_diff']:+.4f} [{x['ci95'][0]:+.4f}, {x['ci95'][1]:+.4f}]</td><td>{x['p_bootstrap']:.4f}</td><td>{x['sign_test']['plus']}/{x['sign_test']['minus']}/{x['sign_test']['ties']}</td><td>{x['sign_test']['p']:.4f}</td></tr>"  # fmt: skip
            for x in report["comparisons"]
            if x["examples"]
        )
        comp = (f"<h2>Paired with the baseline <code>{html.escape(report['baseline'])}</code></h2>"
                "<table><tr><th>cell</th><th>metric</th><th>examples</th><th>mean difference [95% CI]</th>"
                f"<th>p (bootstrap)</th><th>sign test +/-/=</th><th>p (sign)</th></tr>{rows}</table>")  # fmt: skip
    head = "".join(f"<th>{html.escape(m)}</th>" for m in report["metrics"])
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Sweep {html.escape(report['sweep'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right;white-space:nowrap}}td:first-child,th:first-child{{text-align:left}}code{{font-size:90%}}</style></head>
<body><h1>Sweep {html.escape(report['sweep'])}</h1>
<p>{len(report['cells'])} cells; rows generated {report['rows_generated']}, from the cache {report['rows_cached']}; digest <code>{html.escape(report['digest'])}</code></p>
<table><tr><th>cell</th>{head}<th>rows generated</th><th>rows cached</th></tr>{md_rows}</table>
{''.join(sections)}{comp}<p><small>Method: {html.escape(report['method'])}.</small></p></body></html>
"""  # fmt: skip


def write_report(output: Path, report: dict[str, Any]) -> None:
    from rollout.runtime.manifest import write_json_atomic, write_text_atomic

    write_json_atomic(output / "report.json", report)
    write_text_atomic(output / "report.md", render_markdown(report))
    write_text_atomic(output / "report.html", render_html(report))
