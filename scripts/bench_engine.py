#!/usr/bin/env python
"""Engine speed, side by side in one run (issue [1/7]).

32 chat prompts, 64 new tokens each, EOS ignored, temperature 0.8 / top_p 0.95:
  (a) the smollm2 engine at batch sizes 32 and 16 (best reported),
  (b) transformers' own batched `model.generate` on the same weights, batch 32 and 8
      (left padding, the baseline a user would write; not batch-invariant),
  (c) the smollm2 engine at batch size 1.
Also cold and warm engine start (fresh processes), and a check that (a) and (c) gave
bitwise-identical tokens and logprobs. Prints Markdown; `--write FILE` replaces the
engine section of docs/BENCHMARKS.md.
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
PARAMS = SamplingParams(
    temperature=0.8, top_p=0.95, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=True
)


def engine_run(max_num_seqs: int, prompts: list[list[int]]):
    engine = create_engine("smollm2", max_num_seqs=max_num_seqs)
    engine.start()
    reqs = [
        GenerationRequest(str(i), p, PARAMS, seq_seed(0, str(i), 0)) for i, p in enumerate(prompts)
    ]
    started = time.perf_counter()
    results = engine.generate(reqs)
    seconds = time.perf_counter() - started
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
        warm = start_seconds(cold_cache)
    print(f"start: cold {cold:.1f} s, warm {warm:.1f} s", flush=True)

    engine = create_engine("smollm2")
    engine.start()
    texts = [engine.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    prompts = [engine.encode(t) for t in texts]
    model_dir = str(ensure_cached().path)
    engine.close()

    rows: list[tuple[str, float]] = []
    a = {}
    for b in (32, 16):
        rate, a[b] = engine_run(b, prompts)
        rows.append((f"(a) smollm2 engine, batch {b}", rate))
        print(rows[-1], flush=True)
    for b in (32, 8):
        rows.append((f"(b) transformers generate, batch {b}", hf_run_subprocess(b, model_dir)))
        print(rows[-1], flush=True)
    identical = a[32] == a[16]
    if not args.skip_batch1:
        rate, c = engine_run(1, prompts)
        rows.append(("(c) smollm2 engine, batch 1", rate))
        print(rows[-1], flush=True)
        identical = identical and c == a[32]

    best_a = max(r for name, r in rows if name.startswith("(a)"))
    best_b = max(r for name, r in rows if name.startswith("(b)"))
    lines = [
        "## Engine: smollm2 vs transformers (`scripts/bench_engine.py`)",
        "",
        f"32 chat prompts, {NEW_TOKENS} new tokens each, EOS ignored, temperature 0.8, top_p 0.95; "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}. "
        "Measured in one run, side by side.",
        "",
        "| run | output tokens/s |",
        "| --- | ---: |",
        *[f"| {name} | {rate:.1f} |" for name, rate in rows],
        "",
        f"- **ratio (a)/(b), best of each: {best_a / best_b:.2f}** (target >= 1.0, stretch 1.2)",
        f"- tokens and logprobs bitwise identical across the smollm2 batch sizes run: **{identical}**",
        f"- engine start in a fresh process: cold (GGUF conversion) {cold:.1f} s, warm (cached weights) {warm:.1f} s (target <= 5 s)",
        "",
    ]
    publish("\n".join(lines), args.write)


if __name__ == "__main__":
    main()
