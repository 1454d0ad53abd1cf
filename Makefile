# fastslow — the two front-door commands (README) and a few conveniences.
# Needs only python3 (with venv and pip) on a fresh machine; everything else goes into .venv.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
CORES   ?= all
TARGET  ?= results/figures/fig6.pdf results/tables/base_eval.parquet  # the main job (README)
PYTEST_ARGS ?= -q

.PHONY: run test setup setup-test lint bench dry-run clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Set up and run the main job on the embedded default (SmolLM2-135M-Instruct, CPU).
run: setup
	$(BIN)/snakemake --cores $(CORES) $(TARGET)

# Set up and run the test suite (what .ci/run calls).
test: setup-test
	$(BIN)/pytest $(PYTEST_ARGS)

setup: $(BIN)/python
	$(BIN)/pip install --quiet -e .

setup-test: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'

lint: setup-test
	$(BIN)/ruff check src tests workflow bench
	$(BIN)/snakemake --lint

dry-run: setup
	$(BIN)/snakemake -n --quiet rules
	$(BIN)/snakemake -n --quiet rules --configfile config/paper.yaml

# Benchmarks (never part of the test suite): results/bench/*.json and plots.
bench: setup-test
	$(BIN)/snakemake --cores $(CORES) results/data/math/train.parquet results/data/hover_hard/train.parquet
	$(BIN)/python bench/bench_generate.py
	$(BIN)/python bench/bench_call_cost.py
	$(BIN)/python bench/bench_decode.py
	$(BIN)/python bench/bench_prefix.py
	$(BIN)/python bench/bench_rl_step.py
	$(BIN)/python bench/bench_fst_step.py
	$(BIN)/python bench/bench_fst_step.py --task hover_hard --out results/bench/fst_step_hover_hard.json  # README Targets
	$(BIN)/python bench/bench_pool_step.py
	$(BIN)/python bench/paper_cost.py

clean:
	rm -rf results .snakemake
