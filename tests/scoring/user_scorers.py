"""User scorers for the tests (imported by path, as a user's own module would be)."""

from rollout.scoring import scorer


@scorer(version="7")
def brevity(rows, *, limit: int = 100):
    return [(1.0 if len(r.output.split()) <= limit else 0.0, f"{len(r.output.split())} words") for r in rows]  # fmt: skip


def undecorated(rows):
    return [1.0 for _ in rows]
