"""What an audit found: plain dataclasses, a verdict, and the JSON form (also the gRPC form)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rollout.jobs.config_diff import ConfigDifference

IDENTICAL, DIVERGED, INCOMPARABLE = "IDENTICAL", "DIVERGED", "INCOMPARABLE"
EXIT_CODES = {IDENTICAL: 0, DIVERGED: 1, INCOMPARABLE: 3}
REPORT_VERSION = "rollout-audit-v1"


@dataclass
class RunInfo:
    label: str  # what the user named: a directory or a job id
    path: str
    config_hash: str
    run_digest: str
    rows: int
    engine: str
    determinism: str = ""  # the run's contract version (v1, v2); "" for regenerated rows
    score_digest: str = ""  # the digest of the run's score columns; "" when it has none


@dataclass
class Divergence:
    """One (row_index, sample_index) whose two sides differ."""

    row_index: int
    sample_index: int
    example_id: str
    kind: str  # seed | prompt | tokens | finish_reason | logprobs | top_logprobs | example_id
    position: int | None  # first output position where the token ids (or logprob bits) differ
    token_a: int | None  # None: side A's output ended before `position`
    token_b: int | None
    logprob_a: float | None
    logprob_b: float | None
    prompt_differs: bool
    finish_a: str
    finish_b: str
    len_a: int
    len_b: int
    context_start: int  # output position of context_a[0] / context_b[0]
    context_a: list[int]
    context_b: list[int]
    text_a: list[str] | None = (
        None  # context_a decoded token by token (when a tokenizer is at hand)
    )
    text_b: list[str] | None = None


@dataclass
class MissingRow:
    row_index: int
    sample_index: int
    example_id: str


@dataclass
class ScoreDivergence:
    """A row whose score columns differ: the first such column, its values as JSON."""

    row_index: int
    sample_index: int
    example_id: str
    column: str
    a: str
    b: str


@dataclass
class PositionCount:
    position: int
    count: int


@dataclass
class AuditReport:
    kind: str  # audit | verify
    a: RunInfo
    b: RunInfo
    verdict: str = IDENTICAL
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said, but not deciding the verdict
    config_equal: bool = True
    config_diff: list[ConfigDifference] = field(default_factory=list)
    compared: int = 0
    identical: int = 0
    differing: int = 0
    missing_in_a: int = 0
    missing_in_b: int = 0
    inconsistent_a: int = 0  # rows whose stored hashes disagree with their contents
    inconsistent_b: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    first_divergence: list[PositionCount] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)  # the first `max_examples`
    missing: list[MissingRow] = field(default_factory=list)  # the first few on each side
    inconsistent: list[MissingRow] = field(default_factory=list)
    sample: str = ""  # verify: how rows were chosen
    seconds: float = 0.0
    rows_per_s: float = 0.0
    version: str = REPORT_VERSION
    score_differing: int = 0  # rows in both runs whose score columns differ
    score_divergences: list[ScoreDivergence] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def decide(self) -> None:
        """Set verdict and reasons from the counts."""
        reasons = []
        if not self.config_equal:
            paths = ", ".join(d.path for d in self.config_diff[:8])
            reasons.append(f"config_hash differs ({paths}): the runs are not promised equal")
        if self.compared == 0:
            reasons.append("no (row_index, sample_index) is in both runs")
        if self.differing:
            reasons.append(f"{self.differing} of {self.compared} compared rows differ")
        if self.missing_in_a or self.missing_in_b:
            reasons.append(f"rows missing: {self.missing_in_a} in A, {self.missing_in_b} in B")
        if self.score_differing:
            reasons.append(f"{self.score_differing} of {self.compared} compared rows have other scores")  # fmt: skip
        if self.inconsistent_a or self.inconsistent_b:
            reasons.append(
                f"rows whose stored hashes do not match their contents: {self.inconsistent_a} "
                f"in A, {self.inconsistent_b} in B (changed after they were written)"
            )
        self.reasons = reasons
        va, vb = self.a.determinism, self.b.determinism
        if va and vb and va != vb:
            self.notes.append(
                f"run A follows determinism contract {va}, run B {vb}: rows are compared by "
                "their contents, but the two run digests are not comparable"
            )
        if not self.config_equal or self.compared == 0:
            self.verdict = INCOMPARABLE
        elif reasons:
            self.verdict = DIVERGED
        else:
            self.verdict = IDENTICAL

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["exit_code"] = self.exit_code
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditReport:
        """The inverse of to_dict (also reads the gRPC form, where int64 arrive as strings)."""
        from pydantic import TypeAdapter

        data = {k: v for k, v in data.items() if k != "exit_code"}
        return TypeAdapter(cls).validate_python(data)
