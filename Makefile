# The two commands of the README: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU-only machines take the CPU build of torch (a local wheel where one lies on disk); a machine with
# an NVIDIA driver gets the default (CUDA) build of the same release.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test lint install clean gpu-kit gpu-kit-dryrun gpu-check

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,dist,remote,lerobot]"
	touch $@

install: $(VENV)/.installed

# the shipped pusher world model in closed loop with PushSim's pixel expert, next to the simulator's truth
demo: $(VENV)/.installed
	$(VENV)/bin/worldstep rollout --env worldstep/Pusher-v0 --policy push --windows 16 --seed 4 --truth --out rollout.mp4

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info

# --- the GPU path (tests/gpu/README.md) --------------------------------------------------------------------
KIT ?= gpukit

# The kit: what the offline GPU machine lacks (wheels, a trimmed flashinfer with its modules prebuilt for
# sm_90a when nvcc is here, curand headers), <= 60 MiB, git-ignored; carry it to the GPU with the checkout.
gpu-kit: $(VENV)/.installed
	$(PY) tests/gpu/build_kit.py --out $(KIT)

$(KIT)/MANIFEST.json:
	$(MAKE) gpu-kit

# The kit's dry run on this CPU machine: the GPU run's own script over a stand-in of the GPU image.
gpu-kit-dryrun: $(KIT)/MANIFEST.json
	tests/gpu/dryrun.sh

# On the GPU machine, the kit carried along: every check and figure, as JSON under $$OUT, in one run.
gpu-check:
	tests/gpu/run_gpu_checks.sh
