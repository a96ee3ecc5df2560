"""An audit report as a terminal table and as one self-contained HTML file."""

from __future__ import annotations

import html
import json
from pathlib import Path

from rollout.audit.report import IDENTICAL, AuditReport, Divergence, PositionCount
from rollout.runtime.manifest import write_text_atomic


def _short(h: str) -> str:
    return h[:16] if h else "-"


def _value(v: object) -> str:
    text = json.dumps(v, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _tok(d: Divergence, side: str) -> str:
    token = d.token_a if side == "a" else d.token_b
    if token is None:
        return "(end)"
    texts = d.text_a if side == "a" else d.text_b
    ctx = d.context_a if side == "a" else d.context_b
    if texts and d.position is not None:
        return f"{token} {json.dumps(texts[d.position - d.context_start], ensure_ascii=False)}"
    return str(token) if ctx else "(end)"


def _lp(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)  # fmt: skip


def render_text(r: AuditReport, limit: int = 20) -> str:
    """The report for a terminal: summary, config differences, the first divergences."""
    lines = [
        f"{r.kind}: A = {r.a.label}   B = {r.b.label}",
        f"verdict: {r.verdict}" + (f"  ({'; '.join(r.reasons)})" if r.reasons else ""),
    ]
    if r.sample:
        lines.append(f"sample: {r.sample}")
    lines += [f"note: {n}" for n in r.notes]
    lines.append(table([
        ["", "A", "B"],
        ["config_hash", _short(r.a.config_hash), _short(r.b.config_hash)],
        ["run_digest", _short(r.a.run_digest), _short(r.b.run_digest)],
        ["determinism", r.a.determinism or "-", r.b.determinism or "-"],
        ["score_digest", _short(r.a.score_digest) or "-", _short(r.b.score_digest) or "-"],
        ["rows", str(r.a.rows), str(r.b.rows)],
        ["missing here", str(r.missing_in_a), str(r.missing_in_b)],
        ["hash mismatches", str(r.inconsistent_a), str(r.inconsistent_b)],
    ]))  # fmt: skip
    lines.append(
        f"compared {r.compared}, identical {r.identical}, differing {r.differing} "
        f"({r.rows_per_s:,.0f} rows/s)"
    )
    if r.config_diff:
        lines.append("config differences:")
        lines += [f"  {d.path}: {_value(d.a)} -> {_value(d.b)}" for d in r.config_diff]
    if r.kinds:
        lines.append("differences by kind: " + ", ".join(f"{k} {n}" for k, n in r.kinds.items()))
    if r.first_divergence:
        lines.append("first divergence at output position: " + ", ".join(
            f"{p.position} x{p.count}" for p in r.first_divergence[:30]))  # fmt: skip
    if r.divergences:
        shown = r.divergences[:limit]
        lines.append(f"divergent rows (first {len(shown)} of {r.differing}):")
        head = ["row", "sample", "example_id", "kind", "pos", "A token", "B token", "A logprob",
                "B logprob", "prompt", "finish A/B"]  # fmt: skip
        body = [[str(d.row_index), str(d.sample_index), d.example_id[:24], d.kind,
                 "-" if d.position is None else str(d.position), _tok(d, "a"), _tok(d, "b"),
                 _lp(d.logprob_a), _lp(d.logprob_b), "differs" if d.prompt_differs else "same",
                 f"{d.finish_a}/{d.finish_b}"] for d in shown]  # fmt: skip
        lines.append(table([head, *body]))
    if r.score_divergences:
        shown_s = r.score_divergences[:limit]
        lines.append(f"rows with other scores (first {len(shown_s)} of {r.score_differing}):")
        lines.append(table([["row", "sample", "example_id", "column", "A", "B"],
                            *[[str(d.row_index), str(d.sample_index), d.example_id[:24], d.column,
                               d.a[:40], d.b[:40]] for d in shown_s]]))  # fmt: skip
    for title, listed in (
        ("missing rows", r.missing),
        ("rows failing their hashes", r.inconsistent),
    ):
        if listed:
            keys = ", ".join(f"({m.row_index}, {m.sample_index}) {m.example_id!r}" for m in listed)
            lines.append(f"{title} (first {len(listed)}): {keys}")
    return "\n".join(lines)


def _histogram_svg(counts: list[PositionCount], width: int = 720, height: int = 160) -> str:
    if not counts:
        return "<p>No token divergences.</p>"
    top = max(c.position for c in counts) + 1
    bins = min(top, 60)
    per = -(-top // bins)
    values = [0] * bins
    for c in counts:
        values[c.position // per] += c.count
    peak = max(values)
    bar = width / bins
    rects = []
    for i, v in enumerate(values):
        h = (height - 20) * v / peak
        label = f"positions {i * per}-{(i + 1) * per - 1}" if per > 1 else f"position {i}"
        rects.append(
            f'<rect x="{i * bar:.1f}" y="{height - 20 - h:.1f}" width="{max(bar - 1, 1):.1f}" '
            f'height="{h:.1f}"><title>{label}: {v} rows</title></rect>'
        )
    axis = (f'<text x="0" y="{height - 4}">0</text>'
            f'<text x="{width}" y="{height - 4}" text-anchor="end">{top - 1}</text>')  # fmt: skip
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="first divergence '
            f'positions">{"".join(rects)}{axis}</svg>')  # fmt: skip


def _side(d: Divergence, side: str) -> str:
    ctx = d.context_a if side == "a" else d.context_b
    texts = d.text_a if side == "a" else d.text_b
    cells = []
    for k, token in enumerate(ctx):
        pos = d.context_start + k
        shown = html.escape(texts[k]) if texts else str(token)
        cls = ' class="div"' if pos == d.position else ""
        cells.append(f'<span{cls} title="position {pos}, token {token}">{shown}</span>')
    if d.position is not None and d.position >= len(ctx) + d.context_start:
        cells.append('<span class="div">(end)</span>')
    return "".join(cells)


CSS = """body{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}.IDENTICAL{color:#176f2c}
.DIVERGED{color:#b00020}.INCOMPARABLE{color:#8a5a00}svg rect{fill:#4b6fb5}
.tok span{white-space:pre-wrap;border-right:1px dotted #bbb}.tok .div{background:#ffd54f;
font-weight:bold}code{font-size:12px}"""


def render_html(r: AuditReport) -> str:
    e = html.escape
    rows = "".join(
        f"<tr><th>{e(name)}</th><td>{e(str(va))}</td><td>{e(str(vb))}</td></tr>"
        for name, va, vb in [
            ("run", r.a.label, r.b.label),
            ("config_hash", r.a.config_hash, r.b.config_hash),
            ("run_digest", r.a.run_digest, r.b.run_digest),
            ("determinism contract", r.a.determinism, r.b.determinism),
            ("rows", r.a.rows, r.b.rows),
            ("missing here", r.missing_in_a, r.missing_in_b),
            ("stored hashes not matching contents", r.inconsistent_a, r.inconsistent_b),
        ]
    )
    diff = "".join(
        f"<tr><td><code>{e(d.path)}</code></td><td><code>{e(_value(d.a))}</code></td>"
        f"<td><code>{e(_value(d.b))}</code></td></tr>"
        for d in r.config_diff
    )
    pairs = "".join(
        f"<tr><td>{d.row_index}</td><td>{d.sample_index}</td><td>{e(d.example_id)}</td>"
        f"<td>{e(d.kind)}</td><td>{'' if d.position is None else d.position}</td>"
        f"<td class=tok>{_side(d, 'a')}<br><small>{e(_tok(d, 'a'))} lp {_lp(d.logprob_a)} "
        f"{e(d.finish_a)}</small></td><td class=tok>{_side(d, 'b')}<br><small>{e(_tok(d, 'b'))} "
        f"lp {_lp(d.logprob_b)} {e(d.finish_b)}</small></td></tr>"
        for d in r.divergences
    )
    reasons = "".join(f"<li>{e(x)}</li>" for x in r.reasons) or "<li>every row is identical</li>"
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>rollout {e(r.kind)}: {e(r.verdict)}</title><style>{CSS}</style></head><body>
<h1>rollout {e(r.kind)}: <span class="{e(r.verdict)}">{e(r.verdict)}</span></h1>
<ul>{reasons}</ul>{f"<p>Sample: {e(r.sample)}</p>" if r.sample else ""}
<table><tr><th></th><th>A</th><th>B</th></tr>{rows}</table>
<p>Compared {r.compared} rows: {r.identical} identical, {r.differing} differing
({", ".join(f"{e(k)} {n}" for k, n in r.kinds.items()) or "none"}).</p>
<h2>Config differences</h2>{f"<table><tr><th>field</th><th>A</th><th>B</th></tr>{diff}</table>" if diff else "<p>None: the config_hash values are equal.</p>" if r.config_equal else "<p>The config hashes differ.</p>"}
<h2>First divergence positions</h2>{_histogram_svg(r.first_divergence)}
<h2>Divergent pairs (first {len(r.divergences)} of {r.differing})</h2>
{f"<table><tr><th>row</th><th>sample</th><th>example_id</th><th>kind</th><th>position</th><th>A</th><th>B</th></tr>{pairs}</table>" if pairs else "<p>None.</p>"}
<p><small>{e(r.version)}; {r.rows_per_s:,.0f} rows/s; verdict {e(r.verdict)} exits
{0 if r.verdict == IDENTICAL else r.exit_code}.</small></p></body></html>
"""


def write_html(r: AuditReport, path: str | Path) -> None:
    write_text_atomic(Path(path), render_html(r))
