#!/usr/bin/env python
"""Engine speed, side by side in one run (issue [1/6 portable]).

32 chat prompts, temperature 0.8 / top_p 0.95, logprobs on, two workloads:
  fixed: 64 new tokens each, EOS ignored (every sequence runs to the same length);
  mixed: max_tokens from 8 to 128 and EOS honoured (sequences end at different steps,
         so half-empty batches count).
Runs:
  (a) the smollm2 engine: fixed-order kernels (batch-invariant by construction);
  (a0) the same engine without the invariance mechanism: the same forward pass on torch's
       operators (MKL's GEMM, torch's softmax and norms; rollout/engines/smollm2/reference.py);
  (b) transformers' own batched `model.generate` on the same weights (left padding, the
      baseline a user would write; not batch-invariant), in a fresh process;
  (c) the smollm2 engine at batch size 1 (bitwise check against (a)).
Also cold and warm engine start in fresh processes. Prints Markdown; `--write FILE`
replaces the engine section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from rollout.determinism import seq_seed  # noqa: E402
from rollout.engines import GenerationRequest, create_engine  # noqa: E402
from rollout.engines.smollm2.llama import LlamaCPU  # noqa: E402
from rollout.engines.smollm2.reference import LlamaTorch  # noqa: E402
from rollout.engines.smollm2.weights import ensure_cached  # noqa: E402
from rollout.sampling_params import SamplingParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import publish  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain photosynthesis to a ten-year-old.",
    "List three uses of a paperclip.",
    "What is 17 times 23?",
    "Translate 'good morning' into Spanish.",
    "Give me a tip for learning to cook.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What does a compiler do?",
    "Suggest a name for a friendly robot.",
    "How do I make a cup of tea?",
    "Describe the ocean in one sentence.",
    "What are the primary colors?",
    "Write a short thank-you note to a teacher.",
    "What is the difference between weather and climate?",
    "Name three planets in our solar system.",
    "How many legs does a spider have?",
    "Give an example of a renewable energy source.",
    "What is a prime number?",
    "Write a limerick about a cat.",
    "Explain what a database index is.",
    "What should I pack for a day hike?",
    "Why do we have seasons?",
    "Recommend a good habit for mornings.",
    "What is the boiling point of water at sea level?",
    "Describe a rainbow to someone who cannot see.",
    "How does a bicycle stay upright?",
    "What is the largest mammal?",
    "Write a two-line poem about coffee.",
    "What is machine learning, briefly?",
    "Give me a fun fact about octopuses.",
]
NEW_TOKENS = 64


def params(i: int, mixed: bool) -> SamplingParams:
    if mixed:  # 8..128 new tokens, spread over the prompts; EOS ends a sequence early
        return SamplingParams(temperature=0.8, top_p=0.95, max_tokens=8 + (i * 37) % 121, logprobs=True)  # fmt: skip
    return SamplingParams(
        temperature=0.8, top_p=0.95, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=True
    )


def engine_run(engine, prompts: list[list[int]], mixed: bool, forward: type = LlamaCPU):
    """Output tokens/s of one generate call over all prompts, and the results' bits."""
    engine._model.__class__ = forward  # the same weights under the other forward pass
    reqs = [
        GenerationRequest(str(i), p, params(i, mixed), seq_seed(0, str(i), 0))
        for i, p in enumerate(prompts)
    ]
    started = time.perf_counter()
    results = engine.generate(reqs)
    seconds = time.perf_counter() - started
    engine._model.__class__ = LlamaCPU
    tokens = sum(len(r.output_token_ids) for r in results)
    return tokens / seconds, [(r.output_token_ids, r.output_logprobs) for r in results]


def hf_run_subprocess(batch: int, model_dir: str) -> float:
    """(b) in a fresh process with MKL in its default mode, as a user would run it."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    cmd = [sys.executable, __file__, "--hf-only", str(batch), "--model-dir", model_dir]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def hf_run(batch: int, texts: list[str], model_dir: str) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)  # transformers samples from the global RNG
    tokens = 0
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        enc = tok(texts[i : i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=0.8,
                top_p=0.95,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                pad_token_id=tok.pad_token_id,
            )
        tokens += (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    return tokens / (time.perf_counter() - started)


def start_seconds(cache: str) -> float:
    code = (
        "import time; t = time.perf_counter()\n"
        "from rollout.engines import create_engine\n"
        "e = create_engine('smollm2'); e.start()\n"
        "print(time.perf_counter() - t)\n"
    )
    env = {**os.environ, "ROLLOUT_CACHE": cache}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", type=Path, help="replace the engine section of this Markdown file")
    ap.add_argument("--skip-batch1", action="store_true", help="skip (c), the slowest part")
    ap.add_argument("--hf-only", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_only:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model_dir)
        texts = [
            tok.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in PROMPTS
        ]
        print(hf_run(args.hf_only, texts, args.model_dir))
        return

    with tempfile.TemporaryDirectory() as cold_cache:
        cold = start_seconds(cold_cache)
        warm = min(start_seconds(cold_cache) for _ in range(3))
    print(f"start: cold {cold:.1f} s, warm {warm:.1f} s (best of 3)", flush=True)

    engines = {b: create_engine("smollm2", max_num_seqs=b) for b in (32, 16)}
    for e in engines.values():
        e.start()
    e32 = engines[32]
    texts = [e32.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    prompts = [e32.encode(t) for t in texts]
    model_dir = str(ensure_cached().path)

    rows: list[tuple[str, str, float]] = []
    bits: dict[tuple[str, int], list] = {}
    best: dict[tuple[str, str], float] = {}
    for workload in ("fixed", "mixed"):
        mixed = workload == "mixed"
        for _ in range(2):  # alternate the two forward passes, twice: drift hits both alike
            for b, e in engines.items():
                for name, forward in (
                    ("(a) invariant", LlamaCPU),
                    ("(a0) no invariance", LlamaTorch),
                ):
                    rate, out = engine_run(e, prompts, mixed, forward)
                    key = (workload, name)
                    best[key] = max(best.get(key, 0.0), rate)
                    if forward is LlamaCPU:
                        bits[(workload, b)] = out
                    print(workload, name, b, f"{rate:.1f}", flush=True)
        for name in ("(a) invariant", "(a0) no invariance"):
            rows.append(
                (workload, f"{name}, best of batch 32 and 16, 2 rounds", best[(workload, name)])
            )
    for b in (32, 8):
        rate = hf_run_subprocess(b, model_dir)
        rows.append(("fixed", f"(b) transformers generate, batch {b}", rate))
        best[("fixed", "(b)")] = max(best.get(("fixed", "(b)"), 0.0), rate)
        print(rows[-1], flush=True)
    identical = all(bits[(w, 32)] == bits[(w, 16)] for w in ("fixed", "mixed"))
    if not args.skip_batch1:
        one = create_engine("smollm2", max_num_seqs=1)
        one.start()
        rate, c = engine_run(one, prompts, True)
        rows.append(("mixed", "(c) invariant, batch 1", rate))
        identical = identical and c == bits[("mixed", 32)]

    # the tax: time with the mechanism / time without, minus 1 (rates are tokens per second)
    tax = {
        w: best[(w, "(a0) no invariance")] / best[(w, "(a) invariant")] - 1
        for w in ("fixed", "mixed")
    }
    ratio = best[("fixed", "(a) invariant")] / best[("fixed", "(b)")]
    cpu = _cpu_name()
    lines = [
        "## Engine: smollm2 vs transformers (`scripts/bench_engine.py`)",
        "",
        f"32 chat prompts, temperature 0.8, top_p 0.95, logprobs on; {cpu}, {torch.get_num_threads()} "
        f"threads, torch {torch.__version__}. Workload *fixed*: {NEW_TOKENS} new tokens each, EOS "
        "ignored. Workload *mixed*: max_tokens 8 to 128 and EOS honoured, so sequences end at "
        "different steps. Measured in one run, side by side; (a) and (a0) alternate.",
        "",
        "| workload | run | output tokens/s |",
        "| --- | --- | ---: |",
        *[f"| {w} | {name} | {rate:.1f} |" for w, name, rate in rows],
        "",
        f"- **invariance tax (time of (a) / time of (a0) - 1): fixed {tax['fixed']:+.1%}, mixed "
        f"{tax['mixed']:+.1%}** (target <= +5%; negative: the invariant engine is the faster one)",
        f"- **ratio (a)/(b), best of each: {ratio:.2f}** (target >= 1.0)",
        f"- tokens and logprobs bitwise identical across the smollm2 batch sizes run: **{identical}**",
        f"- engine start in a fresh process, imports included: cold (GGUF conversion and kernel "
        f"build) {cold:.1f} s, **warm {warm:.1f} s** (best of 3; target <= 3 s)",
        "",
    ]
    publish("\n".join(lines), args.write)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                flags = Path("/proc/cpuinfo").read_text()
                return f"{name} ({'AVX-512' if ' avx512f' in flags else 'AVX2, no AVX-512'})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
