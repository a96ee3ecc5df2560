"""A user scorer in a module the test service allows."""

from rollout.scoring import scorer


@scorer(version="1")
def tidy(rows):
    return [1.0 if r.columns["answer"].startswith("w") else 0.0 for r in rows]
