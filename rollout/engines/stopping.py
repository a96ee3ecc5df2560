"""When a sequence ends: EOS, stop token ids, stop strings and max_tokens.

Shared by every engine, so that all of them end sequences the same way. DeepInfer has
no stop strings; the service applies them with this same code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rollout.determinism import FinishReason
from rollout.sampling_params import SamplingParams


@dataclass
class StopState:
    """Tracks one sequence's output and decides when it is finished."""

    params: SamplingParams
    eos_token_ids: frozenset[int]
    max_new_tokens: int  # max_tokens, capped by the room left in the context
    decode: Callable[[Sequence[int]], str]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    text: str | None = None  # set when a stop string ended the output

    def append(self, token_id: int) -> bool:
        """Record a sampled token; True when the sequence is finished."""
        self.token_ids.append(token_id)
        p = self.params
        if (token_id in self.eos_token_ids and not p.ignore_eos) or token_id in p.stop_token_ids:
            self.finish_reason = "stop"
        elif p.stop and self._match_stop_string():
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def _match_stop_string(self) -> bool:
        # Decoding the whole output each step keeps multi-token characters right; the
        # outputs that carry stop strings are short enough for this to be cheap.
        full = self.decode(self.token_ids)
        earliest: tuple[int, str] | None = None
        for stop in self.params.stop:
            at = full.find(stop)
            if at != -1 and (earliest is None or at < earliest[0]):
                earliest = (at, stop)
        if earliest is None:
            return False
        at, stop = earliest
        self.text = full[: at + len(stop)] if self.params.include_stop_str_in_output else full[:at]
        return True

    def output_text(self) -> str:
        return self.text if self.text is not None else self.decode(self.token_ids)
