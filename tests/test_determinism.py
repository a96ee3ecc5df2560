"""The determinism contract v1: fixed vectors computed independently (struct + hashlib)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rollout import determinism as d
from rollout.data.columns import list_slices

# From shared/DETERMINISM.md.
CONTRACT_SEEDS = [
    (0, "0", 0, 2196836408974444785),
    (42, "17", 3, 6293115345145438996),
    (18446744073709551615, "prompt-é/7", 0, 7256886613776335195),
]

# (job_seed, example_id, sample_index, prompt ids, output ids, finish_reason,
#  seq_seed, prompt_hash, output_hash, row_hash), computed with struct.pack("<i") + hashlib.
VECTORS = [
    (7, "a", 0, [5], [9, 10], "stop", 9345684245196155200,
     "2594b6a92ebfb1c3312deb7d01c015fb95e9fbe9bd7bc6b527af07813ec7b910",
     "305725c7681df0ac3d63a9624c1d1732547ff3efae0c0b7fe42ba8656b155ed8",
     "f21055d73bc0eaf908d6baf283ff7a0092a3fedb1a1fecef59ca1db2b2618f39"),
    (123456789, "row-000042", 1, [1, 9690, 198], [2], "stop", 9763419516905318492,
     "0d631712d6f96027292fafd58ead16d0b304ad1411385f69fb20e835abab279f",
     "26b25d457597a7b0463f9620f666dd10aa2c4373a505967c7c8d70922a2d6ece",
     "1ba43fe1d020748db6eb669057ba6c2e5075502c857643d588c23dccf0e5d48c"),
    (2**63, "日本語", 7, [0], [49151, -1], "length", 16551634692360431285,
     "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119",
     "9f0fbb3922420174e48b5f26eb0993ff38b8674c8f0056dd225047bea8b7c75a",
     "b64e5b98778c055e5bb7a3c6748bf5dce258658e60f54d83196987cb918dad95"),
    (1, "", 0, list(range(10)), [], "length", 13639663596490774558,
     "10b4796eac59c7d81c33711f219ba227247a4e338adad078159ba01e87590841",
     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
     "d742d81dda7c5a6ec5880cc0973c6b74e0f2638af3866aa538c7c8c9194d445d"),
    (99, "x\ny", 2, [300, 400], [65535, 70000], "stop", 1560079153484268027,
     "e3b6e20a388342f0a867ed428f0c6037f827c69d94b62fff58783828561a6358",
     "4cffdf4b2c69198c830cd15a9a4e0854f54c4dd18cbce514ef45f23e050d0f1a",
     "83f7deef75ed6fe9668cf479c0c6f08cb27e840634f370ef37d724a97f471f56"),
]  # fmt: skip


@pytest.mark.parametrize(("job_seed", "example_id", "sample_index", "expected"), CONTRACT_SEEDS)
def test_contract_seed_vectors(job_seed: int, example_id: str, sample_index: int, expected: int):
    assert d.seq_seed(job_seed, example_id, sample_index) == expected


def test_contract_hash_vectors():
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert d.token_hash([]) == empty
    p = d.token_hash([1, 2, 3])
    assert p == "4636993d3e1da4e9d6b8f87b79e8f7c6d018580d52661950eabc3845c5897a4d"
    seed = d.seq_seed(42, "17", 3)
    assert (
        d.row_hash("17", 3, seed, p, empty, "length")
        == "090ce1ff1d92124b8abb5dedcf63b9730229bd1825c19d61065cbe1684c9ac2c"
    )


@pytest.mark.parametrize("vec", VECTORS, ids=[f"vector{i}" for i in range(len(VECTORS))])
def test_independent_vectors(vec):
    job_seed, ex, si, prompt, output, reason, seed, ph, oh, rh = vec
    assert d.seq_seed(job_seed, ex, si) == seed
    assert d.token_hash(prompt) == ph
    assert d.token_hash(output) == oh
    assert d.row_hash(ex, si, seed, ph, oh, reason) == rh


def test_token_hashes_of_a_list_column_match_the_vectors():
    """The batched form hashes each row straight from an Arrow list column's buffers, here a
    slice (offsets not starting at 0) of a column holding every vector's prompt and output."""
    lists = [v[3] for v in VECTORS] + [v[4] for v in VECTORS]
    column = pa.array([[1, 2, 3]] + lists, pa.list_(pa.int32())).slice(1)
    offsets, values = list_slices(column)
    assert offsets[0] == 3
    assert d.token_hashes(offsets, values) == [v[7] for v in VECTORS] + [v[8] for v in VECTORS]


def test_run_and_shard_digests():
    rows = [
        d.row_hash(
            str(i),
            0,
            d.seq_seed(5, str(i), 0),
            d.token_hash([i]),
            d.token_hash([i, i + 1]),
            "length",
        )
        for i in range(3)
    ]
    assert (
        d.run_digest(rows, "v1")
        == "b45a74301f936565cb0afc098049dbd5cb18d709105206eee3fbcf08fa255993"
    )
    assert (
        d.shard_digest(rows) == "e951c4b39d2c49371a9c7676dc1aaf59b84302940abc157611ad7ff5f771ba18"
    )
    assert d.run_digest(reversed(rows), "v1") != d.run_digest(rows, "v1")
    assert d.run_digest(rows, "v2") != d.run_digest(rows, "v1")
    with pytest.raises(ValueError, match="determinism version must be one of"):
        d.run_digest(rows, "v3")


def test_v2_vectors_of_the_contract():
    """shared/DETERMINISM.md, v2: example 17, sample 3, job_seed 42, prompt [1, 2, 3]."""
    seed = d.seq_seed(42, "17", 3)
    ph, oh = d.token_hash([1, 2, 3]), d.token_hash([5, 6])
    assert oh == "f1833c11f88585608c320b53224d2642b97af5fdb9cae59c13fcab53f37c4b06"
    lh = d.logprobs_hash([-0.5, -1.25])
    assert lh == "34bea0d1df1de51219c2d3a6c5925e8cfce2340be76f296c48349ef17087b6f4"
    th = d.top_logprobs_hash([([5, 9], [-0.5, -1.0]), ([6, 7], [-1.25, -2.0])])
    assert th == "fde5ebd71c65da666d6b86b70417d9ff1062c5bc0a640ecf4e4e0d2e202ae2cd"
    full = d.row_hash_v2("17", 3, seed, ph, oh, "length", lh, th)
    assert full == "f48f4ad8c92b5e2ea915f698e379e513dd258a256de9bf4de8650317e38acd6b"
    empty = d.row_hash_v2("17", 3, seed, ph, d.token_hash([]), "length", "", "")
    assert empty == "571e243dfbca0ae536c6b317b13c1dc2cf5d84041b66da48e271d55ebe18b6ce"
    assert d.run_digest([full, empty], "v2") == (
        "d757b3dcccfd5ae492c6f1015420ea6fa2c6b851a6c572cd21ba35405afb4a30"
    )
    assert d.logprobs_hash(None) == "" and d.top_logprobs_hash(None) == ""
    # the batched form over an Arrow-style flat column, null rows giving ""
    offsets, values = np.array([0, 2, 2, 2]), np.array([-0.5, -1.25], np.float32)
    assert d.logprobs_hashes(offsets, values, np.array([True, True, False])) == [
        lh,
        d.logprobs_hash([]),
        "",
    ]


def test_config_hash_is_canonical():
    a = {"b": [1, 2], "a": "é", "c": {"y": 1.5, "x": None}}
    b = {"c": {"x": None, "y": 1.5}, "a": "é", "b": [1, 2]}
    assert d.canonical_json(a) == '{"a":"é","b":[1,2],"c":{"x":null,"y":1.5}}'.encode()
    assert d.config_hash(a) == d.config_hash(b)
    assert d.config_hash(a) != d.config_hash({**a, "a": "e"})


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: d.seq_seed(-1, "0", 0), "job_seed must be an unsigned 64-bit integer, got -1"),
        (lambda: d.seq_seed(2**64, "0", 0), "job_seed must be an unsigned 64-bit integer"),
        (lambda: d.seq_seed(0, "0", -1), "sample_index must be >= 0, got -1"),
        (lambda: d.row_hash("0", 0, 1, "a", "b", "eos"), "finish_reason must be one of"),
    ],
)
def test_bad_values_are_refused(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        call()
