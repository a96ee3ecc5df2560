"""`rollout generate` as a user runs it: a real process, the real model."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys

from rollout import determinism


def rollout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rollout.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_generate_chat_greedy_answers_paris():
    out = rollout("generate", "--chat", "What is the capital of France?", "--temperature", "0")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_generate_json_carries_seed_and_hashes():
    out = rollout("generate", "Once upon a time", "--temperature", "0.9", "--seed", "42",
                  "--max-tokens", "8", "--ignore-eos", "--json", "--logprobs")  # fmt: skip
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["seq_seed"] == determinism.seq_seed(42, "0", 0)
    assert len(rec["output_token_ids"]) == 8 and len(rec["output_logprobs"]) == 8
    assert rec["finish_reason"] == "length"
    assert rec["prompt_hash"] == determinism.token_hash(rec["prompt_token_ids"])
    assert rec["output_hash"] == determinism.token_hash(rec["output_token_ids"])
    # v2: the row hash covers the logprobs, as recorded (float32 bits)
    lp_hash = hashlib.sha256(struct.pack(f"<{len(rec['output_logprobs'])}f", *rec["output_logprobs"])).hexdigest()  # fmt: skip
    assert rec["determinism"] == "v2" and rec["logprobs_hash"] == lp_hash
    assert rec["top_logprobs_hash"] == ""
    assert rec["row_hash"] == determinism.row_hash_v2(
        "0", 0, rec["seq_seed"], rec["prompt_hash"], rec["output_hash"], "length", lp_hash, ""
    )
    assert rec["engine"]["engine"] == "smollm2"
    again = json.loads(rollout("generate", "Once upon a time", "--temperature", "0.9", "--seed",
                               "42", "--max-tokens", "8", "--ignore-eos", "--json", "--logprobs").stdout)  # fmt: skip
    assert again == rec


def test_generate_bad_values_exit_2_with_the_parameter_named():
    out = rollout("generate", "hi", "--top-p", "1.5")
    assert out.returncode == 2
    assert "invalid top_p: top_p must be in (0, 1], got 1.5" in out.stderr
    out = rollout("generate", "hi", "--seed", "-1")
    assert (
        out.returncode == 2
        and "invalid --seed: must be an unsigned 64-bit integer, got -1" in out.stderr
    )
    out = rollout("generate", "", "--max-tokens", "4")
    assert out.returncode == 2 and "prompt_token_ids: the prompt is empty" in out.stderr
