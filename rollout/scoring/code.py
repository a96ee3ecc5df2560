"""code_tests: run the completion against unit tests in a sandbox; 1 when they pass.

The program is a template over the row's columns and `{output}` (the completion); when
the input has no `prompt` column, `{prompt}` is the prompt text fed to the engine. For
HumanEval: `"{prompt}{output}\\n{test}\\ncheck({entry_point})"`. Each program runs in
rollout/scoring/sandbox.py, several at once on a thread pool (each thread waits on its
subprocess). The detail is passed, failed (with the exception type), timeout or error
(the sandbox refused something, or the output was too large).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollout.scoring.base import Score, Scorer, ScoreRow
from rollout.scoring.sandbox import Limits, run_program


class CodeTestsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    program: str = Field(description='A template over columns, {output} and {prompt}, e.g. "{prompt}{output}\\n{test}\\ncheck({entry_point})".')  # fmt: skip
    timeout_s: float = Field(10.0, gt=0, le=600, description="CPU seconds a program may use (the wall clock allows twice this plus 5 s).")  # fmt: skip
    memory_mb: int = Field(1024, ge=64, le=65536, description="Address-space limit of a program.")
    file_mb: int = Field(1, ge=1, le=1024, description="The most any file a program writes (its output included) may hold.")  # fmt: skip
    workers: int | None = Field(None, ge=1, le=256, description="Programs run at once; default: the CPUs this process may use.")  # fmt: skip


class CodeTests(Scorer):
    key, version, Options, has_detail = "code_tests", "1", CodeTestsOptions, True

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        super().__init__(name, options)
        from rollout.data.prompts import template_fields

        self._fields = template_fields(self.options.program, f"scoring.{name}.program")
        o = self.options
        self.limits = Limits(timeout_s=o.timeout_s, memory_mb=o.memory_mb, file_mb=o.file_mb)

    def columns(self) -> list[str]:
        return [f for f in self._fields if f not in ("output", "prompt")]

    def _program(self, row: ScoreRow) -> str | None:
        values = {}
        for name in self._fields:
            if name == "output":
                value: Any = row.output
            elif name == "prompt" and "prompt" not in row.columns:
                value = row.prompt
            else:
                value = self.reference(row, name)
            if value is None:
                return None
            values[name] = value if isinstance(value, str) else str(value)
        return self.options.program.format_map(values)

    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        programs = [self._program(r) for r in rows]
        workers = self.options.workers or max(1, len(os.sched_getaffinity(0)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout-sandbox") as pool:
            verdicts = list(pool.map(lambda p: None if p is None else run_program(p, self.limits), programs))  # fmt: skip
        return [
            Score(None, "a template column is null") if v is None
            else Score(1.0 if v.status == "passed" else 0.0, v.detail)
            for v in verdicts
        ]  # fmt: skip
