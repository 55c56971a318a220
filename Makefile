# The two commands of the README: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU-only machines take the CPU build of torch (a local wheel where one lies on disk); a machine with
# an NVIDIA driver gets the default (CUDA) build of the same release.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test lint install clean edge-check

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

# Cosmos3-Edge at full size on CPU (issue 15): pipeline parity, kv rollout vs the dense oracle, memory plan vs
# the measured peak. Needs ~17.5 GiB of free RAM; ~25 min on a loaded 2-core box. Writes docs/bench/edge_cpu.json.
edge-check: $(VENV)/.installed
	EDGE_JSON=docs/bench/edge_cpu.json $(PY) -m pytest -q -s -m slow tests/test_edge_size.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
