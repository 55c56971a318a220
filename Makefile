# The two commands of the README: `make demo` and `make test`. Both create .venv when missing.
#   make demo      torch + worldstep's core dependencies, then the demo
#   make test      what the tests import as well (the dev, dist, remote, lerobot and view extras), then the suite
#   make install   = what `make test` installs
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test lint install clean gpu-kit gpu-kit-dryrun gpu-check edge-check view-check

# torch first, so nothing after it pulls another build. A machine without an NVIDIA driver (no nvidia-smi)
# takes the CPU build from PyTorch's CPU wheel index; when that index cannot be reached, the plain pin from
# the default index (pip's find-links may hold a local CPU wheel; otherwise PyPI's default build, with CUDA).
$(VENV)/.torch:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		echo "NVIDIA driver found: torch==$(TORCH_VERSION), the default (CUDA) build"; \
		$(PY) -m pip install -q "torch==$(TORCH_VERSION)"; \
	elif $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/', timeout=10)" 2>/dev/null && \
		$(PY) -m pip install -q --index-url "$(TORCH_CPU_INDEX)" "torch==$(TORCH_VERSION)"; then \
		echo "no NVIDIA driver: torch==$(TORCH_VERSION) from PyTorch's CPU index"; \
	else \
		echo "no NVIDIA driver, and $(TORCH_CPU_INDEX) cannot be reached: torch==$(TORCH_VERSION) from the default index"; \
		$(PY) -m pip install -q "torch==$(TORCH_VERSION)"; \
	fi
	touch $@

# the core: what `worldstep rollout` and the README's API need
$(VENV)/.core: $(VENV)/.torch pyproject.toml
	$(PY) -m pip install -q -e .
	touch $@

# everything the tests import (pytest, torchrl, stable-baselines3, ray, websockets, ...)
$(VENV)/.installed: $(VENV)/.core pyproject.toml Makefile
	$(PY) -m pip install -q -e ".[dev,dist,remote,lerobot,view]"
	touch $@

# openpi's own client library in a venv of its own (it pins numpy<2; worldstep runs numpy 2), so a test can check
# that what RemotePolicy sends is what openpi's client speaks (tests/test_openpi_client.py). openpi-client 0.1.2
# imports typing_extensions without declaring it.
OPENPI_VENV ?= .venv-openpi
$(OPENPI_VENV)/.installed:
	test -x $(OPENPI_VENV)/bin/python || $(PYTHON) -m venv $(OPENPI_VENV)
	$(OPENPI_VENV)/bin/python -m pip install -q "openpi-client==0.1.2" typing_extensions
	touch $@

# LeRobot's own dataset writer and reader in venvs of their own (it pins torch<2.11 and an older diffusers), so the
# tests check that worldstep reads what LeRobot writes and LeRobot reads what worldstep writes
# (tests/test_lerobot_interop.py): lerobot 0.4.4 (format v3.0, the newest for Python 3.11) and 0.3.3 (format v2.1).
# Each gets the local CPU torch first and lerobot without its dependencies, then only what its dataset code
# imports; torchvision too without dependencies (PyPI's build is CUDA's: tests/lerobot_io.py says why no op of
# it runs).
LEROBOT_VENV ?= .venv-lerobot
LEROBOT_V21_VENV ?= .venv-lerobot-v21
$(LEROBOT_VENV)/.installed:
	test -x $(LEROBOT_VENV)/bin/python || $(PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/python -m pip install -q "torch==$(TORCH_VERSION)"
	$(LEROBOT_VENV)/bin/python -m pip install -q --no-deps "lerobot==0.4.4" "torchvision==0.28.0"
	$(LEROBOT_VENV)/bin/python -m pip install -q "datasets>=4,<5" "huggingface-hub>=0.34.2,<0.36" "av>=15,<16" \
		"accelerate>=1.10,<2" "packaging>=24.2,<26" pillow
	touch $@
$(LEROBOT_V21_VENV)/.installed:
	test -x $(LEROBOT_V21_VENV)/bin/python || $(PYTHON) -m venv $(LEROBOT_V21_VENV)
	$(LEROBOT_V21_VENV)/bin/python -m pip install -q "torch==$(TORCH_VERSION)"
	$(LEROBOT_V21_VENV)/bin/python -m pip install -q --no-deps "lerobot==0.3.3" "torchvision==0.28.0"
	$(LEROBOT_V21_VENV)/bin/python -m pip install -q "datasets>=2.19,<=3.6.0" "huggingface-hub>=0.34.2,<0.36" \
		"av>=15,<16" "accelerate>=1.10,<2" "packaging>=24.2,<26" "jsonlines>=4" pillow
	touch $@

# LeRobot 0.4.4's video reader and `lerobot-eval` in its venv (tests/test_lerobot_pixels.py,
# tests/test_lerobot_eval.py).
# torchcodec 0.13.0 is the newest CPU build on PyPI (0.14 on needs CUDA's libraries) and loads FFmpeg's shared
# libraries. They come from pip, not apt: the `av` wheel already in this venv bundles FFmpeg 7.1 in `av.libs/` under
# renamed files, so `ffmpeg-libs/` links every file of it and adds the sonames torchcodec looks for; the tests put
# that folder on LeRobot's LD_LIBRARY_PATH. This keeps `make test` self-contained (Debian's `ffmpeg` package works
# too but changes the system). Then what ACT, Diffusion Policy and lerobot-eval import (the pins lerobot 0.4.4
# declares), and worldstep's remote env client without its dependencies (no torch or diffusers of worldstep's).
LEROBOT_FFMPEG_SONAMES = avutil.so.59 avcodec.so.61 avformat.so.61 avdevice.so.61 avfilter.so.10 swscale.so.8 \
	swresample.so.5
$(LEROBOT_VENV)/.eval: $(LEROBOT_VENV)/.installed pyproject.toml
	$(LEROBOT_VENV)/bin/python -m pip install -q --no-deps "torchcodec==0.13.0"
	$(LEROBOT_VENV)/bin/python -m pip install -q "einops>=0.8,<0.9" "draccus==0.10.0" "gymnasium>=1.1.1,<2" \
		"termcolor>=2.4,<4" "imageio[ffmpeg]>=2.34,<3" "deepdiff>=7.0.1,<9" "diffusers>=0.27.2,<0.36" \
		"jsonlines>=4,<5" "pyserial>=3.5,<4" "websockets>=15" "msgpack>=1.0" "pydantic>=2.6" "pyyaml>=6"
	$(LEROBOT_VENV)/bin/python -m pip install -q --no-deps -e .
	@libs=$$($(LEROBOT_VENV)/bin/python -c "import av, pathlib; print(pathlib.Path(av.__file__).parent.parent / 'av.libs')") && \
	test -d "$$libs" || { echo "no av.libs next to the av wheel in $(LEROBOT_VENV): torchcodec has no FFmpeg to load"; exit 1; }; \
	rm -rf $(LEROBOT_VENV)/ffmpeg-libs && mkdir $(LEROBOT_VENV)/ffmpeg-libs && ln -s "$$libs"/* $(LEROBOT_VENV)/ffmpeg-libs/ && \
	for soname in $(LEROBOT_FFMPEG_SONAMES); do \
		found=$$(ls "$$libs"/lib$${soname%%.so.*}-*.so.$${soname##*.so.}.* 2>/dev/null | head -n1); \
		test -n "$$found" || { echo "av.libs in $(LEROBOT_VENV) has no lib$$soname (FFmpeg 7.1's): torchcodec 0.13 cannot load"; exit 1; }; \
		ln -s "$$found" $(LEROBOT_VENV)/ffmpeg-libs/lib$$soname; \
	done
	touch $@

install: $(VENV)/.installed $(OPENPI_VENV)/.installed $(LEROBOT_VENV)/.eval $(LEROBOT_V21_VENV)/.installed

# the shipped pusher world model in closed loop with PushSim's pixel expert, next to the simulator's truth
demo: $(VENV)/.core
	$(VENV)/bin/worldstep rollout --env worldstep/Pusher-v0 --policy push --windows 16 --seed 20000000 --truth --out rollout.mp4
	@echo "Watch it live: $(PY) -m pip install -e '.[view]', then add --rerun-serve to the command above and open the URL it prints (a browser; over SSH, forward its two ports), or --rerun for the native viewer; --rerun-save run.rrd keeps a recording."

test: $(VENV)/.installed $(OPENPI_VENV)/.installed $(LEROBOT_VENV)/.eval $(LEROBOT_V21_VENV)/.installed
	WORLDSTEP_OPENPI_PYTHON=$(abspath $(OPENPI_VENV))/bin/python \
	WORLDSTEP_LEROBOT_PYTHON=$(abspath $(LEROBOT_VENV))/bin/python \
	WORLDSTEP_LEROBOT_V21_PYTHON=$(abspath $(LEROBOT_V21_VENV))/bin/python $(PY) -m pytest -q tests

# Cosmos3-Edge at full size on CPU (issue 15): pipeline parity, kv rollout vs the dense oracle, memory plan vs
# the measured peak. Needs ~17.5 GiB of free RAM; ~25 min on a loaded 2-core box. Writes docs/bench/edge/cpu.json.
edge-check: $(VENV)/.installed
	EDGE_JSON=docs/bench/edge/cpu.json $(PY) -m pytest -q -s -m slow tests/test_edge_size.py

# Debian's Chromium, headless, opens the served web viewer on the demo's rollout and screenshots it into
# docs/images/rerun_viewer.png (needs `apt-get install -y chromium`; not part of `make test`; about 2 minutes).
view-check: $(VENV)/.installed
	$(PY) tests/view_check.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info

# --- the GPU path (tests/gpu/README.md) --------------------------------------------------------------------
KIT ?= gpukit
KIT_DIR = $(abspath $(KIT))
# downloads and nvcc's objects (the FA3 prebuild takes minutes on an idle 2-core box, an hour on a busy one)
KIT_WORK ?= build/gpukit-work
# prebuild only some modules (name prefixes, e.g. KIT_ONLY=cascade): a quick kit whose check names the rest
KIT_ONLY ?=

# What building the kit needs, and no more: torch (the JitSpecs name dtypes) and what `import flashinfer`
# loads on a CPU (tests/gpu/kit-build-requirements.txt); flashinfer itself and its JIT tools are unpacked
# by build_kit.py into its work folder. Not the test extras: a fresh box reaches `make gpu-kit` in minutes.
$(VENV)/.gpukit: $(VENV)/.torch tests/gpu/kit-build-requirements.txt
	$(PY) -m pip install -q -r tests/gpu/kit-build-requirements.txt
	touch $@

# The kit: what the offline GPU machine lacks (wheels, a trimmed flashinfer with its modules prebuilt for
# sm_90a when nvcc is here, curand headers), <= 60 MiB, git-ignored; carry it to the GPU with the checkout.
# Its path goes to nvcc as an include folder from other working folders, so it is made absolute here.
gpu-kit: $(VENV)/.gpukit
	$(PY) tests/gpu/build_kit.py --out $(KIT_DIR) --work $(abspath $(KIT_WORK)) $(if $(KIT_ONLY),--only $(KIT_ONLY))

$(KIT_DIR)/MANIFEST.json:
	$(MAKE) gpu-kit KIT=$(KIT_DIR) KIT_WORK=$(abspath $(KIT_WORK)) KIT_ONLY=$(KIT_ONLY)

# The kit's dry run on this CPU machine: the GPU run's own script over a stand-in of the GPU image.
gpu-kit-dryrun: $(KIT_DIR)/MANIFEST.json $(VENV)/.gpukit
	GPU_KIT=$(KIT_DIR) PYTHON=$(abspath $(PY)) tests/gpu/dryrun.sh

# On the GPU machine, the kit carried along: every check and figure, as JSON under $$OUT, in one run.
gpu-check:
	GPU_KIT=$(KIT_DIR) tests/gpu/run_gpu_checks.sh
