"""A user scorer that fails on one kind of row, for the on_error tests."""

from rollout.scoring import scorer


@scorer(version="1")
def fussy(rows):
    for r in rows:
        if "SCORER-BOOM" in r.prompt:
            raise ValueError("cannot score this")
    return [1.0 for _ in rows]
