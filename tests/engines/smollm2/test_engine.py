"""The smollm2 engine on the real model: canary, seeds, sampling features, bad input."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from rollout.determinism import seq_seed
from rollout.engines import GenerationRequest
from rollout.errors import InputError
from rollout.sampling_params import SamplingParams

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def chat_ids(engine, messages=FRANCE) -> list[int]:
    return engine.encode(engine.apply_chat_template(messages))


def one(engine, ids, params, seed=1, rid="0"):
    (result,) = engine.generate([GenerationRequest(rid, ids, params, seed)])
    return result


def test_greedy_canary_paris(smollm2):
    result = one(smollm2, chat_ids(smollm2), SamplingParams(temperature=0, max_tokens=32))
    assert "Paris" in result.output_text
    assert result.finish_reason == "stop"
    assert result.output_token_ids[-1] == 2  # <|im_end|> ends the answer and is kept
    assert "<|im_end|>" not in result.output_text


def test_chat_template_and_tokenizer_come_from_the_gguf(smollm2):
    text = smollm2.apply_chat_template(FRANCE)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = smollm2.encode(text)
    assert ids[0] == 1 and smollm2.decode(ids).startswith("system\nYou are")


def test_same_seed_reproduces_and_other_seed_changes(smollm2):
    ids = chat_ids(smollm2, [{"role": "user", "content": "Write a short poem about the sea."}])
    p = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, logprobs=True)
    s1, s2 = seq_seed(1, "poem", 0), seq_seed(1, "poem", 1)
    a, b, c = one(smollm2, ids, p, s1), one(smollm2, ids, p, s1), one(smollm2, ids, p, s2)
    assert a.output_token_ids == b.output_token_ids and a.output_logprobs == b.output_logprobs
    assert a.output_token_ids != c.output_token_ids


def test_logprobs_and_top_logprobs_agree(smollm2):
    ids = chat_ids(smollm2)
    p = SamplingParams(
        temperature=0.7, max_tokens=12, logprobs=True, top_logprobs=5, ignore_eos=True
    )
    r = one(smollm2, ids, p, seed=5)
    assert len(r.output_logprobs) == len(r.top_logprobs) == len(r.output_token_ids) == 12
    for token, lp, top in zip(r.output_token_ids, r.output_logprobs, r.top_logprobs, strict=True):
        assert lp <= 0.0 and len(top) == 5
        assert [t[1] for t in top] == sorted((t[1] for t in top), reverse=True)
        assert sum(math.exp(t[1]) for t in top) <= 1.0 + 1e-5
        if token in dict(top):
            assert dict(top)[token] == pytest.approx(lp, abs=1e-6)


def test_stop_strings_and_stop_token_ids(smollm2):
    ids = chat_ids(smollm2)
    greedy = SamplingParams(temperature=0, max_tokens=32)
    full = one(smollm2, ids, greedy).output_text
    assert full.startswith("The capital of France is Paris")
    r = one(smollm2, ids, greedy.model_copy(update={"stop": [" is "]}))
    assert (r.output_text, r.finish_reason) == ("The capital of France", "stop")
    r = one(
        smollm2,
        ids,
        greedy.model_copy(update={"stop": [" is "], "include_stop_str_in_output": True}),
    )
    assert r.output_text == "The capital of France is "
    first = one(smollm2, ids, greedy).output_token_ids[1]
    r = one(smollm2, ids, greedy.model_copy(update={"stop_token_ids": [first]}))
    assert len(r.output_token_ids) == 2 and r.finish_reason == "stop"


def test_max_tokens_and_ignore_eos(smollm2):
    ids = chat_ids(smollm2)
    r = one(smollm2, ids, SamplingParams(temperature=0, max_tokens=3))
    assert len(r.output_token_ids) == 3 and r.finish_reason == "length"
    r = one(smollm2, ids, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert len(r.output_token_ids) == 20 and r.finish_reason == "length"


def test_generation_is_capped_by_the_context(smollm2_factory):
    engine = smollm2_factory(max_model_len=64)
    r = one(
        engine, list(range(100, 160)), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    )
    assert len(r.output_token_ids) == 4 and r.finish_reason == "length"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.5, "temperature must be a finite number >= 0, got -0.5"),
        ("top_p", 0.0, "top_p must be in (0, 1], got 0.0"),
        ("top_p", 1.5, "top_p must be in (0, 1], got 1.5"),
        ("top_k", 0, "top_k must be -1 (disabled) or >= 1, got 0"),
        ("top_k", -2, "top_k must be -1 (disabled) or >= 1, got -2"),
        ("max_tokens", 0, "max_tokens must be in [1, 1048576], got 0"),
        ("top_logprobs", 1001, "top_logprobs must be in [0, 1000], got 1001"),
    ],
)
def test_bad_sampling_params_name_parameter_and_value(field, value, message):
    with pytest.raises(ValidationError) as err:
        SamplingParams(**{field: value})
    (e,) = err.value.errors()
    assert e["loc"] == (field,)
    assert message in e["msg"]


def test_unknown_sampling_field_is_refused():
    with pytest.raises(ValidationError, match="n_samples"):
        SamplingParams(n_samples=2)


def test_prompt_longer_than_context_is_refused_unless_truncated(smollm2):
    long = [100 + (i % 1000) for i in range(2100)]
    with pytest.raises(InputError) as err:
        one(smollm2, long, SamplingParams(max_tokens=4), rid="long")
    assert "request 'long': prompt_token_ids" in str(err.value)
    assert "2100 tokens" in str(err.value) and "2048" in str(err.value)
    assert "truncate_prompt_tokens" in str(err.value)
    r = one(smollm2, long, SamplingParams(temperature=0, max_tokens=4, truncate_prompt_tokens=1000))
    assert r.prompt_token_ids == long[-1000:] and len(r.output_token_ids) == 4


def test_empty_prompt_and_bad_token_ids_are_refused(smollm2):
    with pytest.raises(InputError, match="request 'e': prompt_token_ids: the prompt is empty"):
        one(smollm2, [], SamplingParams(), rid="e")
    with pytest.raises(InputError, match=r"token id 49152 is outside the vocabulary \[0, 49152\)"):
        one(smollm2, [1, 49152], SamplingParams())


def test_fingerprint_names_everything_that_decides_output(smollm2):
    fp = smollm2.fingerprint()
    assert fp["engine"] == "smollm2" and fp["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert len(fp["weights_sha256"]) == 64 and fp["dtype"] == "float32"
    assert fp["batch_invariant"] is True  # the start-up self-test passed on this CPU
    assert fp["sampler"] == "rollout-sampler-v2" and fp["max_model_len"] == 2048
    assert fp["engine_version"] == "2" and fp["machine"] in ("x86_64", "aarch64")
    assert fp["numerics"]["kernels"] == "rollout-cpu-kernels-v1"
    assert len(fp["numerics"]["rope_sha256"]) == 64
    # what gives the same bits is not in it: the SIMD path, the BLAS, the CPU capability
    assert "gemm" not in fp and "cpu_capability" not in str(fp)


def test_the_kernels_compute_what_torch_operators_compute(smollm2):
    """The fixed-order forward is the same function as the torch-operator one, to float
    precision: the same greedy tokens, logits within 1e-3."""
    import torch

    from rollout.engines.smollm2.llama import KVCache, LlamaCPU
    from rollout.engines.smollm2.reference import LlamaTorch

    model = smollm2._model
    prompts = [smollm2.encode(t) for t in ("The capital of France is", "def add(a, b):\n   ", "Hi")]

    def run(cls):
        model.__class__ = cls
        try:
            caches = [KVCache(model.cfg, len(p) + 6) for p in prompts]
            steps = [model.prefill(prompts, caches)]
            for _ in range(5):
                steps.append(model.decode([int(t) for t in steps[-1].argmax(-1)], caches))
            return torch.stack(steps)
        finally:
            model.__class__ = LlamaCPU

    ours, theirs = run(LlamaCPU), run(LlamaTorch)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert (ours - theirs).abs().max() < 1e-3


def test_second_start_loads_the_cached_weights(smollm2, smollm2_factory):
    other = smollm2_factory(max_num_seqs=4)
    assert other.converted_weights is False
    assert other.fingerprint()["weights_sha256"] == smollm2.fingerprint()["weights_sha256"]
