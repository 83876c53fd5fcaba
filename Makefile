# Two entry points: `make test` (what CI runs) and `make demo`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: test lint demo clean

$(BIN)/pipeline: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

lint: $(BIN)/pipeline
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

# A dry run of the LinkedIn job on the bundled sample against the simulator (no model, no GPU).
DEMO_PORT ?= 8765
demo: $(BIN)/pipeline
	@$(BIN)/pipeline sim --port $(DEMO_PORT) --model openai/gpt-oss-120b --latency 1 --jitter 0.5 & sim=$$!; \
	trap "kill $$sim" EXIT; \
	$(BIN)/python -c "import httpx2, time; [time.sleep(0.2) for _ in range(50) \
	  if httpx2.get('http://127.0.0.1:$(DEMO_PORT)/health').status_code != 200]" 2>/dev/null || sleep 2; \
	PIPELINE_BASE_URL=http://127.0.0.1:$(DEMO_PORT)/v1 $(BIN)/pipeline run jobs/linkedin.yaml

clean:
	rm -rf $(VENV) data/*.duckdb data/*.duckdb.wal data/*.progress.json
