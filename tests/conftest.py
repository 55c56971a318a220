"""Suite-wide setup: the suite imports the test extras, so a venv without them stops at once with the fix."""

from __future__ import annotations

import importlib.util

import pytest

# what `make test` installs beyond the core (pyproject's dev, dist, remote, lerobot and view extras)
TEST_EXTRAS = ("hypothesis", "torchrl", "stable_baselines3", "ray", "websockets", "msgpack", "pyarrow", "rerun",
               "datafusion", "scipy", "moviepy", "coverage")


def pytest_configure(config: pytest.Config) -> None:
    missing = [name for name in TEST_EXTRAS if importlib.util.find_spec(name) is None]
    if missing:
        raise pytest.UsageError(f"the test extras are not installed (missing: {', '.join(missing)}); run `make "
                                "test`, or `pip install -e '.[dev,dist,remote,lerobot,view]'` in this venv")
