# marconi-ray developer entry points. `make test` is what CI runs (.ci/run).
# Everything installs into $(VENV); torch is pinned to the CPU build first (see DESIGN.md).

VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
OUT     ?= runs/sample

.PHONY: install run demo lint types contracts pytest test clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## The main job: the OpenAI-compatible service with the tiny preset model on
## 127.0.0.1:8000 (local Ray, embedded defaults; it prints how to send a request).
## Ctrl-C stops it cleanly.
run: $(STAMP)
	$(VENV)/bin/marconi-ray serve

## The offline pieces: replay the packaged ShareGPT sample through the four systems at
## four cache sizes ($(OUT)/results.json and a PNG), then chat with a tiny model through
## the in-process engine.
MODEL   ?= runs/tiny-nemotron_h

demo: $(STAMP)
	$(VENV)/bin/marconi-ray replay --trace sample --cache-bytes 2e8,5e8,1e9,2e9 \
		--systems vanilla,vllm+,sglang+,marconi --out $(OUT)
	$(VENV)/bin/marconi-ray make-model --preset tiny --family nemotron_h --out $(MODEL) --overwrite
	$(VENV)/bin/marconi-ray generate --model $(MODEL) --max-tokens 16 \
		--prompt "Hello! What is a hybrid LLM?" --prompt "And why cache its SSM states?" \
		--prompt "Thanks."

lint: $(STAMP)
	$(VENV)/bin/ruff check marconi_ray tests scripts benchmarks kernels loadgen

types: $(STAMP)
	$(VENV)/bin/mypy marconi_ray loadgen

contracts: $(STAMP)
	$(VENV)/bin/lint-imports

pytest: $(STAMP)
	$(PY) -m pytest -q

test: lint types contracts pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
