"""Where two config views (what `config_hash` is computed over) differ, field by field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ConfigDifference:
    path: str  # dotted, with [i] for list items: "sampling.temperature", "input.fingerprint.files[0].sha256"
    a: Any  # the value on side A (None where the field is absent)
    b: Any


def config_diff(a: Any, b: Any, path: str = "") -> list[ConfigDifference]:
    """Every leaf where `a` and `b` differ, in sorted key order."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[ConfigDifference] = []
        for key in sorted(set(a) | set(b), key=str):
            out += config_diff(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += config_diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [ConfigDifference(path or "(root)", a, b)]
