# marconi-ray developer entry points. `make test` is what CI runs (.ci/run).
# Everything installs into $(VENV); torch is pinned to the CPU build first (see docs/ARCHITECTURE.md).

VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
OUT     ?= runs/sample

# The GPU fast path (Triton kernels): triton (CUDA builds of torch bring their own; the CPU
# build gets it from PyPI, for TRITON_INTERPRET=1) and mamba-ssm's Triton kernels from its
# sdist with the CUDA extensions skipped: a pure-Python wheel, seconds to build, no nvcc.
MAMBA_SSM ?= 2.3.2.post1
TRITON    ?= 3.9.0
WHEELS    := build/wheels
GPU_STAMP := $(VENV)/.installed-gpu

.PHONY: install install-gpu gpu-bundle redis run demo lint types contracts pytest test clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(WHEELS)/.mamba-ssm-$(MAMBA_SSM): $(STAMP)
	mkdir -p $(WHEELS)
	$(PY) -m pip install -q setuptools wheel packaging einops
	MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE $(PY) -m pip wheel -q \
		--no-build-isolation --no-deps "mamba-ssm==$(MAMBA_SSM)" -w $(WHEELS)
	touch $@

$(GPU_STAMP): $(STAMP) $(WHEELS)/.mamba-ssm-$(MAMBA_SSM)
	$(PY) -c "import triton" 2>/dev/null || $(PY) -m pip install -q "triton==$(TRITON)"
	$(PY) -m pip install -q --no-deps --force-reinstall $(WHEELS)/mamba_ssm-$(MAMBA_SSM)-*.whl
	$(PY) -c "from marconi_kernels.mamba_ssm_import import import_mamba_triton; \
		import_mamba_triton(); print('mamba-ssm Triton kernels import')"
	touch $@

## The Triton fast path on any Linux machine, CPU or GPU (no nvcc, seconds): verify it
## with `TRITON_INTERPRET=1 marconi-ray generate --kernels triton ...` on a CPU.
install-gpu: $(GPU_STAMP)

## What scripts/gpu_check.sh needs on a GPU machine with no network (build/gpu-bundle,
## about 4 MB): the mamba-ssm wheel, msgpack for CPython 3.10-3.13, pytest.
gpu-bundle: $(WHEELS)/.mamba-ssm-$(MAMBA_SSM)
	rm -rf build/gpu-bundle && mkdir -p build/gpu-bundle
	cp $(WHEELS)/mamba_ssm-$(MAMBA_SSM)-*.whl build/gpu-bundle/
	for v in 3.10 3.11 3.12 3.13; do $(PY) -m pip download -q --no-deps --only-binary=:all: \
		--python-version $$v --platform manylinux2014_x86_64 -d build/gpu-bundle msgpack; done
	$(PY) -m pip download -q --no-deps -d build/gpu-bundle pytest pluggy iniconfig pygments

## The main job: the OpenAI-compatible service with the packaged trained `chat` model on
## 127.0.0.1:8000 (local Ray, embedded defaults; it prints how to send a request).
## Ctrl-C stops it cleanly.
run: $(STAMP)
	$(VENV)/bin/marconi-ray serve --model chat

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

## redis-server for the journal and recovery tests: Debian's package, installed when missing
## (apt-get as root, sudo otherwise); a clear message where neither works.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
		elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; \
		else echo "redis-server is missing and this user can neither apt-get nor sudo:" \
			"install Debian's redis-server package (the journal tests start it)" >&2; exit 1; fi; \
		command -v apt-get >/dev/null 2>&1 || { echo "redis-server is missing and there is" \
			"no apt-get here: install redis-server (>= 6) with this system's package manager" >&2; \
			exit 1; }; \
		echo "installing redis-server (apt-get)"; \
		$$SUDO apt-get install -y -q redis-server >/dev/null 2>&1 || { \
			$$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q redis-server >/dev/null; }; \
	}
	@redis-server --version

pytest: $(STAMP) $(GPU_STAMP) redis
	scripts/pytest_split.sh $(PY)

## Everything installed first, then the static checks run beside pytest (whose Ray tests
## spend most of their time waiting): their few lines of output land among pytest's.
test: $(STAMP) $(GPU_STAMP) redis
	$(MAKE) -j4 lint types contracts pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
