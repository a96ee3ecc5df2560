"""The synthetic engine's columns against a token-by-token reference written from its docs."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pyarrow as pa

from rollout.engines import GenerationRequest, create_engine
from rollout.sampling_params import SamplingParams

M64 = (1 << 64) - 1
FIRST_WORD, EOS = 259, 2


def splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def reference(prompt: list[int], seed: int, params: SamplingParams, vocab: int, mean: int):
    """Token t is splitmix(key ^ splitmix(t)) into the word ids; the natural length is
    uniform in 1..2*mean-1 from the same key; EOS replaces the token where it falls."""
    digest = hashlib.blake2b(struct.pack(f"<{len(prompt)}i", *prompt), digest_size=8).digest()
    key = (0 if params.greedy else seed) ^ int.from_bytes(digest, "little")
    natural = 1 + splitmix(key ^ 0xA5A5A5A5) % (2 * mean - 1)
    eos = not params.ignore_eos and natural <= params.max_tokens
    n = natural if eos else params.max_tokens
    hashes = [splitmix(key ^ splitmix(t)) for t in range(n)]
    ids = [FIRST_WORD + h % (vocab - FIRST_WORD) for h in hashes]
    if eos:
        ids[-1] = EOS
    text = "".join(f" w{t}" for t in ids if t != EOS)
    logprobs = [float(np.float32(-((h >> 20) % 1000)) / np.float32(100)) for h in hashes]  # float32
    return ids, text, "stop" if eos else "length", logprobs


def test_columns_match_a_token_by_token_reference():
    vocab, mean = 1 << 20, 12  # ids with up to 7 digits in the text
    engine = create_engine("synthetic", vocab_size=vocab, mean_output_len=mean)
    engine.start()
    kinds = [
        SamplingParams(temperature=1.0, max_tokens=30, logprobs=True),
        SamplingParams(temperature=0.0, max_tokens=8),
        SamplingParams(temperature=0.7, max_tokens=40, ignore_eos=True, logprobs=True),
    ]
    reqs = [
        GenerationRequest(f"r{i}", engine.encode(f"prompt {i // 2}"), kinds[i % 3], 7 * i + 1)
        for i in range(60)
    ]
    batch = engine.generate_batch(reqs)
    assert batch.output_token_ids.type == pa.list_(pa.int32())
    ids, texts = batch.output_token_ids.to_pylist(), batch.output_text.to_pylist()
    lps = batch.output_logprobs.to_pylist()
    for i, r in enumerate(reqs):
        want_ids, want_text, want_finish, want_lps = reference(
            list(r.prompt_token_ids), r.seq_seed, r.params, vocab, mean
        )
        assert (ids[i], texts[i], batch.finish_reason[i]) == (want_ids, want_text, want_finish)
        assert texts[i] == engine.decode(ids[i])
        assert lps[i] == (want_lps if r.params.logprobs else None)
    assert set(batch.finish_reason) == {"stop", "length"}
    assert any(len(str(t)) == 7 for row in ids for t in row)


def test_mixed_parameters_give_each_request_what_it_gives_alone():
    """Stop strings, stop ids, top logprobs and plain rows in one batch, in either order."""
    engine = create_engine("synthetic", vocab_size=400, mean_output_len=10)
    engine.start()
    kinds = [
        SamplingParams(max_tokens=30, stop=[" w30"], logprobs=True),
        SamplingParams(max_tokens=30, stop_token_ids=[300, 301], top_logprobs=2),
        SamplingParams(max_tokens=30, stop=["w3"], include_stop_str_in_output=True),
        SamplingParams(max_tokens=30, ignore_eos=True),
    ]
    reqs = [
        GenerationRequest(str(i), engine.encode(f"p{i}"), kinds[i % 4], 11 * i) for i in range(48)
    ]
    alone = [engine.generate([r])[0] for r in reqs]
    together = engine.generate(reqs[::-1])[::-1]
    assert together == alone
    by_kind = [[a for a, r in zip(alone, reqs, strict=True) if r.params is k] for k in kinds]
    assert any(a.output_text.endswith("w3") and a.finish_reason == "stop" for a in by_kind[2])
    assert any(a.output_token_ids[-1] in (300, 301) for a in by_kind[1])
    assert all(a.top_logprobs and len(a.top_logprobs[0]) == 2 for a in by_kind[1])
    assert all(a.output_logprobs is None for a in by_kind[3])
    assert all(" w30" not in a.output_text for a in by_kind[0])


def test_a_batch_past_one_text_chunk_keeps_every_row():
    engine = create_engine("synthetic", output_len="fixed", mean_output_len=3)
    engine.start()
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    reqs = [GenerationRequest(str(i), [FIRST_WORD + i % 50], params, i) for i in range(5000)]
    batch = engine.generate_batch(reqs)
    assert batch.output_text.num_chunks == 2 and len(batch.output_text) == 5000
    texts = batch.output_text.to_pylist()
    assert texts == [engine.decode(ids) for ids in batch.output_token_ids.to_pylist()]
    assert all(t.count(" w") == 3 for t in texts)
