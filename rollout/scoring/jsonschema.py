"""json_schema: 1 when the output parses as JSON and validates against a schema."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollout.scoring.base import Score, Scorer, ScoreRow

MAX_SCHEMA_BYTES = 64 * 1024


class JsonSchemaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: dict[str, Any] | None = Field(None, alias="schema", description="A JSON Schema (draft 2020-12 unless it says otherwise).")  # fmt: skip
    schema_column: str | None = Field(None, description="A column holding each row's schema (a JSON string or a mapping).")  # fmt: skip
    strip_code_fence: bool = Field(True, description="Read the JSON inside a ```json fence when the output has one.")  # fmt: skip

    @model_validator(mode="after")
    def _one(self) -> JsonSchemaOptions:
        if (self.schema_ is None) == (self.schema_column is None):
            raise ValueError("exactly one of schema, schema_column must be set")
        if self.schema_ is not None:
            from jsonschema import validators
            from jsonschema.exceptions import SchemaError

            if len(json.dumps(self.schema_)) > MAX_SCHEMA_BYTES:
                raise ValueError(f"schema is larger than {MAX_SCHEMA_BYTES} bytes")
            try:
                validators.validator_for(self.schema_).check_schema(self.schema_)
            except SchemaError as exc:
                raise ValueError(f"schema is not a valid JSON Schema: {exc.message}") from None
        return self


def _json_text(output: str, strip_fence: bool) -> str:
    text = output.strip()
    if strip_fence and "```" in text:
        start = text.index("```")
        body = text[start + 3 :]
        body = body.split("\n", 1)[1] if "\n" in body else ""
        end = body.find("```")
        text = body[:end] if end >= 0 else body
    return text


class JsonSchema(Scorer):
    """1 when the output is JSON valid under the schema, else 0; the detail says why not."""

    key, version, Options, has_detail = "json_schema", "1", JsonSchemaOptions, True

    def columns(self) -> list[str]:
        return [self.options.schema_column] if self.options.schema_column else []

    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        from jsonschema import validators

        o = self.options
        fixed = validators.validator_for(o.schema_)(o.schema_) if o.schema_ is not None else None
        out = []
        for row in rows:
            validator = fixed
            if validator is None:
                schema = self.reference(row, o.schema_column)
                if schema is None:
                    out.append(Score(None, "no schema"))
                    continue
                schema = json.loads(schema) if isinstance(schema, str) else schema
                validator = validators.validator_for(schema)(schema)
            try:
                value = json.loads(_json_text(row.output, o.strip_code_fence))
            except ValueError as exc:
                out.append(Score(0.0, f"not JSON: {exc}"))
                continue
            error = next(iter(validator.iter_errors(value)), None)
            if error is None:
                out.append(Score(1.0, "valid"))
            else:
                where = "/".join(map(str, error.absolute_path)) or "(root)"
                out.append(Score(0.0, f"invalid at {where}: {error.message[:200]}"))
        return out
