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
    _hypothesis_profile()


def _hypothesis_profile() -> None:
    """Every property test's settings beyond its example count: no deadline and no too-slow health check (both
    read the wall clock, so a loaded box would fail them), and function-scoped fixtures allowed (the fixtures
    these tests use hold models that every example may share)."""
    from hypothesis import HealthCheck, settings

    settings.register_profile("worldstep", deadline=None,
                              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    settings.load_profile("worldstep")
