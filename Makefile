# Two commands for a fresh machine: `make run` and `make test` (see README.md).
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
NATIVE  := $(VENV)/.native

.PHONY: run test check lint format fuzz bench train-demo clean browser docs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel on this disk; pinned first so no dependency pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

# The C++ kernel of the compiled step's products (gateway/speed/native.py); where it cannot
# be built the Python kernel serves, so this never fails.
$(NATIVE): $(STAMP) gateway/speed/linear_rows.cpp
	$(BIN)/python -c "from gateway.speed import packed_linear as p; \
		print('gateway::linear_rows:', p.KERNEL.name, 'kernel')"
	touch $(NATIVE)

run: $(STAMP) $(NATIVE)
	$(BIN)/python -m gateway

# The llama.cpp backend (the `llamacpp` extra: llama-cpp-python and gguf; docs/backends.md),
# for make test, never for make run. pip builds llama-cpp-python from its sdist (CMake, a C++
# compiler) once per machine and keeps the wheel in its cache; later installs reuse it.
# LLAMA_CMAKE_ARGS builds what the Python package loads (libllama, ggml) for this CPU
# (GGML_NATIVE) and leaves out llama.cpp's tests, examples, tools, server and app, the
# multimodal library (mtmd/llava) and curl/OpenSSL. On x86 it also leaves out ggml's AMX
# kernels: on a CPU with AMX they crash llama_decode on quantized weights (Q8_0, Q4_K_M;
# tests/unit/engine/llamacpp/test_quantized.py), and AVX-512/AVX2 kernels serve instead.
LLAMA := $(VENV)/.llamacpp
NO_AMX := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
	-DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
	'-DCMAKE_C_FLAGS=$(NO_AMX)' '-DCMAKE_CXX_FLAGS=$(NO_AMX)'

$(LLAMA): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(BIN)/pip install -q -e ".[llamacpp]"
	touch $(LLAMA)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy gateway/engine gateway/speed gateway/database gateway/serving gateway/costmodel.py gateway/limits.py \
		policies models_registry

# The docs as a site (MkDocs, mkdocs.yml) in var/site/; --strict: a broken link or anchor
# fails (tests/unit/test_docs_hygiene.py builds it in make test too).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The console's browser tests drive Debian's chromium (Playwright with executable_path; a
# browser download cannot work here). Installed when missing; outside CI a machine without
# root skips those tests instead, under CI=true they fail.
CHROMIUM := /usr/bin/chromium

browser:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		($$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$$SUDO apt-get install -y -qq chromium) \
		|| { [ "$$CI" != true ] && echo "chromium not installed: browser tests will skip"; }; \
	fi

# Every test runs (CI calls this); the 25 slowest are listed at the end. The slow families
# carry markers (compile, browser, fuzz, postgres; pyproject.toml): PYTEST_ARGS='-m "not
# compile"' leaves one out locally. The tests run in one process per core (pytest-xdist;
# tests/conftest.py starts the slowest first); tests that share a costly fixture carry an
# xdist_group mark, so they run on one worker. TEST_WORKERS=0: one process.
TEST_WORKERS ?= auto
test: $(STAMP) $(NATIVE) $(LLAMA) lint browser
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 \
		-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

# schemathesis against /schema/openapi.json for FUZZ_MINUTES (tenant, auditor, admin keys).
FUZZ_MINUTES ?= 10
fuzz: $(STAMP)
	$(BIN)/python -m tests.integration.service.fuzz --minutes $(FUZZ_MINUTES)

bench: $(STAMP) $(NATIVE)
	$(BIN)/python -m benchmarks

train-demo: $(STAMP)
	$(BIN)/python -m models_registry.demo.train

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
