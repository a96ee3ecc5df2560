"""render: each wanted row's prompt text (the chat template applied), or the row skipped."""

from __future__ import annotations

from rollout.data.prompts import render_rows
from rollout.errors import InputError
from rollout.runtime.stages.base import ShardWork, Stage


def example_id_of(row: dict, id_column: str | None, row_index: int) -> str:
    if id_column is None:
        return str(row_index)
    value = row.get(id_column)
    if value is None:
        raise InputError(f"row {row_index}", f"id column {id_column!r} is null")
    return value if isinstance(value, str) else str(value)


def _skippable(problem: str) -> bool:
    return problem.endswith("is null") or problem == "the prompt is empty"


class Render(Stage):
    name = "render"
    needs = ("rows",)

    def run(self, work: ShardWork) -> None:
        spec, task, rows = work.spec, work.task, work.rows
        assert rows is not None
        wanted = None if task.samples is None else {r for r, _ in task.samples}
        texts: list[str | None] = [None] * len(rows)
        if spec.input.format == "openai-batch":  # each request carries its messages or prompt
            for offset, row in enumerate(rows):
                if wanted is None or task.start + offset in wanted:
                    texts[offset] = (work.engine.apply_chat_template(row["messages"])
                                     if row.get("messages") is not None else row.get("prompt"))  # fmt: skip
            work.texts = texts
            return
        if spec.prompt is None:  # teacher forcing from prompt token ids: nothing to render
            work.texts = texts
            return
        for offset, (row, prompt) in enumerate(zip(rows, render_rows(rows, spec.prompt), strict=True)):  # fmt: skip
            row_index = task.start + offset
            if wanted is not None and row_index not in wanted:
                continue
            if prompt.problem is not None:
                example_id = example_id_of(row, spec.id_column, row_index)
                if spec.prompt.on_empty == "skip" and _skippable(prompt.problem):
                    work.skipped.append({"row_index": row_index, "example_id": example_id, "stage": "render", "reason": prompt.problem})  # fmt: skip
                    continue
                raise InputError(f"input row {row_index} (example {example_id!r})", prompt.problem)
            texts[offset] = (
                work.engine.apply_chat_template(prompt.messages)
                if prompt.messages is not None
                else prompt.text
            )
        work.texts = texts
