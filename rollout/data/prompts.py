"""Turn input rows into prompt text: a text column, a chat messages column, or a template.

Each job checks the columns it needs against the input schema before any work starts,
and names the available columns when one is missing.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from rollout.errors import ConfigError, InputError
from rollout.jobs.spec import JobSpec, PromptSpec


def template_fields(template: str, parameter: str = "prompt.template") -> list[str]:
    """The column names a template uses; only plain `{name}` fields are allowed."""
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(parameter, template, f"is not a valid template: {exc}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() and not name.replace("-", "_").replace(" ", "_").isidentifier():
            raise ConfigError(
                parameter,
                template,
                f"field {{{name}}} must be a plain column name (no attributes, no indexing)",
            )
        if spec or conversion:
            raise ConfigError(
                parameter,
                template,
                f"field {{{name}}} may not carry a format spec or conversion",
            )
        fields.append(name)
    if not fields:
        raise ConfigError(parameter, template, "uses no column; write fields like {question}")
    return fields


def needed_columns(spec: JobSpec) -> list[str]:
    """Every input column the job reads, in a stable order."""
    from rollout.scoring.registry import is_import_path, scorer_class

    p = spec.prompt
    cols: list[str] = []
    if p is not None and p.column:
        cols.append(p.column)
    if p is not None and p.messages_column:
        cols.append(p.messages_column)
    if p is not None and p.template:
        cols.extend(template_fields(p.template))
    if spec.input.format == "openai-batch":
        cols += ["url", "model", "messages", "prompt", "params"]
    tf = spec.teacher_forcing
    if tf is not None:
        cols += [c for c in (tf.prompt_ids_column, tf.completion_column, tf.completion_ids_column) if c]  # fmt: skip
    if spec.id_column:
        cols.append(spec.id_column)
    cols.extend(spec.carry_columns)
    for e in spec.scoring:
        cols.extend(e.columns)
        if not is_import_path(e.scorer):
            scorer = scorer_class(e.scorer, f"scoring.{e.name}.scorer")(e.name, e.options)
            cols.extend(scorer.columns())
    return list(dict.fromkeys(cols))


def check_columns(schema: pa.Schema, spec: JobSpec, where: str) -> None:
    """Every column the job reads exists, and the prompt column holds the right kind of value."""
    available = schema.names
    for col in needed_columns(spec):
        if col not in available:
            role = _role_of(spec, col)
            raise InputError(
                where, f"has no column {col!r} ({role}); available columns: {', '.join(available)}"
            )
    p = spec.prompt
    if p is not None and p.column is not None:
        kind = schema.field(p.column).type
        if not (
            pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)
        ):
            raise InputError(where, f"column {p.column!r} (prompt.column) holds {kind}, not text")
    if p is not None and p.messages_column is not None:
        kind = schema.field(p.messages_column).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_null(kind)):
            raise InputError(
                where,
                f"column {p.messages_column!r} (prompt.messages_column) holds {kind}, not a list "
                "of {role, content} messages",
            )


def _role_of(spec: JobSpec, col: str) -> str:
    p = spec.prompt
    if p is not None and col == p.column:
        return "prompt.column"
    if p is not None and col == p.messages_column:
        return "prompt.messages_column"
    tf = spec.teacher_forcing
    if tf is not None and col in (
        tf.prompt_ids_column,
        tf.completion_column,
        tf.completion_ids_column,
    ):
        return "teacher_forcing"
    if col == spec.id_column:
        return "id_column"
    if col in spec.carry_columns:
        return "carry_columns"
    if p is not None and p.template and col in template_fields(p.template):
        return "a field of prompt.template"
    return "read by a scorer of scoring"


@dataclass
class RenderedPrompt:
    """A row's prompt, or why it has none."""

    text: str | None = None
    messages: list[dict[str, str]] | None = None
    problem: str | None = None


def render_rows(rows: Sequence[dict[str, Any]], prompt: PromptSpec) -> list[RenderedPrompt]:
    fields = template_fields(prompt.template) if prompt.template else []  # parsed once
    return [_render(row, prompt, fields) for row in rows]


def _render(row: dict[str, Any], p: PromptSpec, fields: list[str]) -> RenderedPrompt:
    if p.messages_column:
        return _messages(row.get(p.messages_column), p.messages_column)
    if p.column:
        value = row.get(p.column)
        if value is None:
            return RenderedPrompt(problem=f"column {p.column!r} is null")
        if not isinstance(value, str):
            return RenderedPrompt(
                problem=f"column {p.column!r} is {type(value).__name__}, not a string"
            )
        text = value
    else:
        assert p.template is not None
        values = {}
        for name in fields:
            v = row.get(name)
            if v is None:
                return RenderedPrompt(problem=f"template column {name!r} is null")
            values[name] = v if isinstance(v, str) else str(v)
        text = p.template.format_map(values)
    if not text.strip():
        return RenderedPrompt(problem="the prompt is empty")
    if p.chat:
        messages = ([{"role": "system", "content": p.system}] if p.system else []) + [
            {"role": "user", "content": text}
        ]
        return RenderedPrompt(messages=messages)
    return RenderedPrompt(text=text)


def _messages(value: Any, column: str) -> RenderedPrompt:
    if value is None:
        return RenderedPrompt(problem=f"column {column!r} is null")
    if not isinstance(value, list) or not value:
        return RenderedPrompt(
            problem=f"column {column!r} must be a non-empty list of {{role, content}}, got {type(value).__name__}"
        )
    out = []
    for i, m in enumerate(value):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            return RenderedPrompt(
                problem=f"column {column!r}: message {i} must be {{role: string, content: string}}, got {m!r}"[
                    :300
                ]
            )
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in out):
        return RenderedPrompt(problem="the prompt is empty")
    return RenderedPrompt(messages=out)
