"""Shared by the benchmark scripts: publishing a report into docs/BENCHMARKS.md."""

from __future__ import annotations

import re
from pathlib import Path


def publish(report: str, path: Path | None) -> None:
    """Print a Markdown section; with `path`, replace the section of the same heading there."""
    print(report)
    if path is None:
        return
    heading = report.splitlines()[0]
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(heading) + r".*?(?=\n## |\Z)", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: report.rstrip() + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + report
    path.write_text(text.rstrip() + "\n")
