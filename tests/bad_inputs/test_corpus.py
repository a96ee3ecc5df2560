"""Every case of the bad-input corpus against one real service: the specific error, no
output left behind, and the service still serving afterwards."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from rollout.api.server import Server
from rollout.client import RolloutClient, state_name
from tests.bad_inputs.corpus import CASES, Case

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"


@pytest.fixture(scope="module")
def service(ray_runtime, tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    server = Server("127.0.0.1:0", tmp_path_factory.mktemp("state"), [root])
    server.start()
    with RolloutClient(f"127.0.0.1:{server.port}") as client:
        yield root, client
    server.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_its_error(service, case: Case):
    root, client = service
    spec = case.build(root)
    out = Path(spec["output"]) if "://" not in spec["output"] else None
    if case.expect[0] == "submit":
        _, status, pattern = case.expect
        with pytest.raises(grpc.RpcError) as err:
            client.submit(spec)
        assert err.value.code().name == status, err.value.details()
        assert re.search(pattern, err.value.details()), err.value.details()
    else:
        _, pattern = case.expect
        job = client.submit(spec)
        last = list(client.watch(job.job_id))[-1]
        assert state_name(last) == "FAILED", last
        assert re.search(pattern, last.error), last.error
    if out is not None and out.is_dir() and out.resolve().is_relative_to(root.resolve()):
        assert not (out / "data").exists()  # nothing a reader could take as a result
    assert client.health() == "SERVING"


def test_the_corpus_is_documented_and_large_enough():
    text = DOCS.read_text(encoding="utf-8")
    assert len(CASES) >= 30
    missing = [c.name for c in CASES if f"`{c.name}`" not in text]
    assert not missing, f"docs/security.md does not list: {missing}"
