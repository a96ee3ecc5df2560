"""Compare two row streams key by key: a merge join on (row_index, sample_index).

Both streams are sorted, so the comparison holds one record batch per side at a time,
whatever the size of the runs. Positions are counted per position (bounded by
max_tokens); only the first `max_examples` divergences are kept in full.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np

from rollout.audit.report import AuditReport, Divergence, MissingRow, PositionCount
from rollout.audit.runs import Rows
from rollout.errors import JobCancelled

Key = tuple[int, int]
RowStream = Iterator[tuple[Key, Rows, int]]
ProgressFn = Callable[[str, int, int], None]  # (phase, done, total)
CONTEXT = 8  # tokens shown on each side of a divergence
MAX_LISTED = 10  # missing or inconsistent rows listed by key


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first index where two arrays differ, len(shorter) if one is a prefix of the other."""
    n = min(len(a), len(b))
    unequal = np.flatnonzero(a[:n] != b[:n])
    if len(unequal):
        return int(unequal[0])
    return None if len(a) == len(b) else n


def _at(tokens: np.ndarray, pos: int | None) -> int | None:
    return int(tokens[pos]) if pos is not None and pos < len(tokens) else None


def divergence(ra: Rows, i: int, rb: Rows, j: int) -> Divergence | None:
    """How row i of `ra` and row j of `rb` (the same key) differ; None if they do not."""
    out_a, out_b = ra.output(i), rb.output(j)
    lp_a, lp_b = ra.logprobs(i), rb.logprobs(j)
    pos = first_difference(out_a, out_b)
    prompt_differs = ra.prompt_hash[i] != rb.prompt_hash[j]
    if ra.seq_seed[i] != rb.seq_seed[j]:
        kind = "seed"
    elif prompt_differs:
        kind = "prompt"
    elif pos is not None:
        kind = "tokens"
    elif ra.finish_reason[i] != rb.finish_reason[j]:
        kind = "finish_reason"
    elif ra.example_id[i] != rb.example_id[j]:
        kind = "example_id"
    elif lp_a is not None and lp_b is not None and len(lp_a) == len(lp_b):
        # bit patterns, so that NaN == NaN and -0.0 != 0.0
        pos = first_difference(lp_a.view(np.uint32), lp_b.view(np.uint32))
        if pos is not None:
            kind = "logprobs"
        elif ra.top_hash[i] and rb.top_hash[j] and ra.top_hash[i] != rb.top_hash[j]:
            kind = "top_logprobs"  # v2 covers them: the same tokens, other alternatives
        else:
            return None
    elif ra.top_hash[i] and rb.top_hash[j] and ra.top_hash[i] != rb.top_hash[j]:
        kind = "top_logprobs"
    else:
        return None
    start = max(0, (pos or 0) - CONTEXT)
    end = (pos or 0) + CONTEXT + 1
    return Divergence(
        row_index=ra.row_index[i],
        sample_index=ra.sample_index[i],
        example_id=ra.example_id[i],
        kind=kind,
        position=pos,
        token_a=_at(out_a, pos),
        token_b=_at(out_b, pos),
        logprob_a=float(lp_a[pos]) if lp_a is not None and pos is not None and pos < len(lp_a) else None,
        logprob_b=float(lp_b[pos]) if lp_b is not None and pos is not None and pos < len(lp_b) else None,
        prompt_differs=prompt_differs,
        finish_a=ra.finish_reason[i],
        finish_b=rb.finish_reason[j],
        len_a=len(out_a),
        len_b=len(out_b),
        context_start=start,
        context_a=[int(t) for t in out_a[start:end]],
        context_b=[int(t) for t in out_b[start:end]],
    )  # fmt: skip


def compare_streams(
    report: AuditReport,
    a: RowStream,
    b: RowStream,
    max_examples: int = 50,
    progress: ProgressFn | None = None,
    total: int = 0,
    cancel: threading.Event | None = None,
) -> AuditReport:
    """Fill `report`'s counts from two sorted row streams, then decide its verdict."""
    started = time.monotonic()
    positions: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    missing: list[MissingRow] = []
    inconsistent: list[MissingRow] = []
    seen_a = seen_b = 0
    na, nb = next(a, None), next(b, None)
    while na is not None or nb is not None:
        if (seen_a + seen_b) % 65536 == 0:
            if cancel is not None and cancel.is_set():
                raise JobCancelled("the audit was cancelled")
            if progress is not None:
                progress("compare", max(seen_a, seen_b), total)
        if nb is None or (na is not None and na[0] < nb[0]):
            key, rows, i = na  # type: ignore[misc]
            report.missing_in_b += 1
            _note(missing, rows, i)
            report.inconsistent_a += _check(inconsistent, rows, i)
            na, seen_a = next(a, None), seen_a + 1
            continue
        if na is None or nb[0] < na[0]:
            key, rows, i = nb
            report.missing_in_a += 1
            _note(missing, rows, i)
            report.inconsistent_b += _check(inconsistent, rows, i)
            nb, seen_b = next(b, None), seen_b + 1
            continue
        _, ra, i = na
        _, rb, j = nb
        report.compared += 1
        report.inconsistent_a += _check(inconsistent, ra, i)
        report.inconsistent_b += _check(inconsistent, rb, j)
        d = None
        if ra.row_hash[i] != rb.row_hash[j] or ra.logprobs(i) is not None or ra.top_hash[i]:
            d = divergence(ra, i, rb, j)
        if d is None:
            report.identical += 1
        else:
            report.differing += 1
            kinds[d.kind] += 1
            if d.position is not None:
                positions[d.position] += 1
            if len(report.divergences) < max_examples:
                report.divergences.append(d)
        na, nb = next(a, None), next(b, None)
        seen_a, seen_b = seen_a + 1, seen_b + 1
    if progress is not None:
        progress("compare", max(seen_a, seen_b), max(total, seen_a, seen_b))
    report.kinds = dict(sorted(kinds.items()))
    report.first_divergence = [PositionCount(p, c) for p, c in sorted(positions.items())]
    report.missing, report.inconsistent = missing, inconsistent
    report.seconds = time.monotonic() - started
    report.rows_per_s = (seen_a + seen_b) / 2 / report.seconds if report.seconds else 0.0
    report.decide()
    return report


def _check(inconsistent: list[MissingRow], rows: Rows, i: int) -> int:
    """1, noted, when row i's stored hashes disagree with its contents; else 0."""
    if rows.consistent[i]:
        return 0
    _note(inconsistent, rows, i)
    return 1


def _note(listed: list[MissingRow], rows: Rows, i: int) -> None:
    if len(listed) < MAX_LISTED:
        listed.append(MissingRow(rows.row_index[i], rows.sample_index[i], rows.example_id[i]))
