"""A user scorer a submitter names but the operator never allowed: importing it would be
running the submitter's code in the service, so the test checks that it is never imported."""

from rollout.scoring import scorer

IMPORTED = True


@scorer(version="1")
def planted(rows):
    return [1.0 for _ in rows]
