"""The precomputed-coefficient UniPC stepper equals diffusers' `UniPCMultistepScheduler`, step by step.

Both get the same sample and velocity at every step (the velocity a fixed random function of the step), so a
difference at one step cannot hide behind a later one. Bound: `UNIPC_ATOL` (measured 0 on the CPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import UniPCMultistepScheduler
from worldstep.engine.models.cosmos3.checkpoint import SCHEDULER_CONFIG
from worldstep.engine.models.cosmos3.unipc import UNIPC_ATOL, UniPCStepper, check_supported, unipc_plan


def _diffusers(config, steps: int, shift: float, native: bool) -> UniPCMultistepScheduler:
    scheduler = UniPCMultistepScheduler.from_config(config, flow_shift=shift)
    if native:
        sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, steps + 1)[:-1]
        scheduler.set_timesteps(steps, sigmas=sigmas)
    else:
        scheduler.set_timesteps(steps)
    scheduler.set_begin_index(0)
    return scheduler


CASES = [(steps, shift, native, {}) for steps in (1, 2, 3, 4, 8, 30) for shift in (1.0, 5.0)
         for native in (False, True)]
CASES += [(6, 5.0, False, {"solver_order": 3}), (6, 5.0, False, {"solver_type": "bh1"}),
          (6, 3.0, True, {"disable_corrector": [1, 3]}), (5, 5.0, False, {"solver_order": 1})]


@pytest.mark.parametrize("steps,shift,native,extra", CASES)
def test_stepper_equals_diffusers_step_by_step(steps, shift, native, extra):
    config = {**SCHEDULER_CONFIG, **extra}
    reference = _diffusers(config, steps, shift, native)
    plan = unipc_plan(config, steps, shift, native)
    assert plan.timesteps == tuple(reference.timesteps.tolist())
    stepper = UniPCStepper(plan)
    gen = torch.Generator().manual_seed(steps)
    sample = torch.randn(2, 3, 2, 4, 4, generator=gen)
    worst = 0.0
    for t in reference.timesteps:
        velocity = torch.randn(sample.shape, generator=gen)
        want = reference.step(velocity, t, sample, return_dict=False)[0]
        got = stepper.step(velocity, sample)
        assert torch.isfinite(got).all()
        worst = max(worst, (got - want).abs().max().item())
        sample = want  # both continue from the same sample
    assert worst <= UNIPC_ATOL, worst


def test_plans_are_computed_once_per_schedule():
    a = unipc_plan(SCHEDULER_CONFIG, 4, 5.0, False)
    assert unipc_plan(dict(SCHEDULER_CONFIG), 4, 5, False) is a
    assert unipc_plan(SCHEDULER_CONFIG, 4, 3.0, False) is not a


def test_configs_it_cannot_reproduce_are_refused():
    with pytest.raises(ValueError, match=r"scheduler_config\['prediction_type'\]='epsilon' is invalid; allowed: "
                                         r"'flow_prediction'"):
        check_supported({**SCHEDULER_CONFIG, "prediction_type": "epsilon"})
    with pytest.raises(ValueError, match=r"scheduler_config\['solver_type'\]='bh3' is invalid"):
        check_supported({**SCHEDULER_CONFIG, "solver_type": "bh3"})
