"""UniPC (flow prediction, x0 form) with every per-step coefficient computed on the host before the loop.

diffusers' `UniPCMultistepScheduler` keeps its sigmas on the CPU and, at every step, copies several of them to
the device and solves a small linear system there: host waits inside the denoise loop. The coefficients depend
only on the schedule (steps, shift, the checkpoint's scheduler config), so `unipc_plan` computes them once per
schedule with diffusers' formulas, on CPU float32 tensors as diffusers does, and `UniPCStepper` applies them
to device tensors with Python-float scalars: the loop never reads from or copies to the device's host side.
The result equals diffusers' step within float32 rounding (`UNIPC_ATOL`; tests/test_unipc.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

# Stepper vs diffusers' scheduler on the same inputs, per step, in latent units: the coefficients are the same
# float32 values; only the order of a few multiply-adds differs. Measured 0 on the CPU (tests/test_unipc.py).
UNIPC_ATOL = 1e-5


@dataclass(frozen=True)
class Update:
    """One UniP (predictor) or UniC (corrector) update as scalars:
    ``x_t = ratio * x - m0_coef * m0 - res_coef * (sum_k rhos[k] * (m_k - m0) / rks[k] [+ rhos[-1] * (m_t - m0)])``."""

    ratio: float  # sigma_t / sigma_s0
    m0_coef: float  # alpha_t * (e^{-h} - 1)
    res_coef: float  # alpha_t * B(h)
    rks: tuple[float, ...]  # per older output: (lambda_si - lambda_s0) / h
    rhos: tuple[float, ...]  # per older output (and, for a corrector, last: the fresh output's weight)


@dataclass(frozen=True)
class StepCoefficients:
    """What step ``i`` needs: the sigma that turns velocity into x0, the corrector (None at step 0) and the
    predictor, with how many past outputs each reads."""

    sigma: float
    corrector: Update | None
    predictor: Update


@dataclass(frozen=True)
class UniPCPlan:
    """A window's schedule: the model's timesteps (host floats) and each step's coefficients."""

    timesteps: tuple[float, ...]
    steps: tuple[StepCoefficients, ...]
    history: int  # past x0 predictions an update may read (the solver order)


def check_supported(config: dict[str, Any]) -> None:
    """The scheduler config is one this stepper reproduces (ValueError naming the setting otherwise)."""
    wanted = {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "predict_x0": True,
              "thresholding": False}
    for name, value in wanted.items():
        if config.get(name, value) != value:
            raise ValueError(f"scheduler_config[{name!r}]={config[name]!r} is invalid; allowed: {value!r}")
    if config.get("solver_type", "bh2") not in ("bh1", "bh2"):
        raise ValueError(f"scheduler_config['solver_type']={config['solver_type']!r} is invalid; "
                         "allowed: 'bh1' or 'bh2'")


def unipc_plan(config: dict[str, Any], num_steps: int, flow_shift: float, native_flow_schedule: bool) -> UniPCPlan:
    """The plan of a window schedule, computed once per (config, steps, shift, schedule kind) and cached."""
    return _cached_plan(json.dumps(config, sort_keys=True), int(num_steps), float(flow_shift),
                        bool(native_flow_schedule))


@lru_cache(maxsize=64)
def _cached_plan(config_json: str, num_steps: int, flow_shift: float, native: bool) -> UniPCPlan:
    from diffusers import UniPCMultistepScheduler

    config = json.loads(config_json)
    check_supported(config)
    scheduler = UniPCMultistepScheduler.from_config(config, flow_shift=flow_shift)
    if native:
        sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, num_steps + 1)[:-1]
        scheduler.set_timesteps(num_steps, device="cpu", sigmas=sigmas)
    else:
        scheduler.set_timesteps(num_steps, device="cpu")
    sig = scheduler.sigmas  # [N + 1] on the CPU
    cfg = scheduler.config
    n = len(scheduler.timesteps)
    orders = [_order(i, n, cfg.solver_order, cfg.lower_order_final) for i in range(n)]
    bh2 = cfg.solver_type == "bh2"
    steps = []
    for i in range(n):
        corrector = None
        if i > 0 and (i - 1) not in cfg.disable_corrector:
            corrector = _update(sig, i, i - 1, orders[i - 1], bh2, corrector=True)
        steps.append(StepCoefficients(float(sig[i]), corrector, _update(sig, i + 1, i, orders[i], bh2, False)))
    return UniPCPlan(tuple(scheduler.timesteps.tolist()), tuple(steps), cfg.solver_order)


def _order(i: int, n: int, solver_order: int, lower_order_final: bool) -> int:
    """The predictor's order at step ``i``: warming up from 1, lowered near the end when configured."""
    order = min(solver_order, n - i) if lower_order_final else solver_order
    return min(order, min(i, solver_order) + 1)


def _lam(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(alpha, sigma, lambda = log alpha - log sigma) of a flow sigma."""
    alpha = 1 - sigma
    return alpha, sigma, torch.log(alpha) - torch.log(sigma)


def _update(sig: torch.Tensor, t: int, s0: int, order: int, bh2: bool, corrector: bool) -> Update:
    """The scalars of an update from sigma index ``s0`` to ``t`` reading ``order - 1`` older outputs."""
    alpha_t, sigma_t, lambda_t = _lam(sig[t])
    _, sigma_s0, lambda_s0 = _lam(sig[s0])
    h = lambda_t - lambda_s0
    rks = [(_lam(sig[s0 - k])[2] - lambda_s0) / h for k in range(1, order)]
    rk_all = torch.stack([*rks, torch.ones(())])
    hh = -h  # the x0 form
    h_phi_1 = torch.expm1(hh)
    b_h = torch.expm1(hh) if bh2 else hh
    rows, rhs, h_phi_k, factorial = [], [], h_phi_1 / hh - 1, 1
    for k in range(1, order + 1):
        rows.append(torch.pow(rk_all, k - 1))
        rhs.append(h_phi_k * factorial / b_h)
        factorial *= k + 1
        h_phi_k = h_phi_k / hh - 1 / factorial
    r, b = torch.stack(rows), torch.stack(rhs)
    if corrector:
        rhos = [0.5] if order == 1 else torch.linalg.solve(r, b).tolist()
    else:
        rhos = [] if order == 1 else [0.5] if order == 2 else torch.linalg.solve(r[:-1, :-1], b[:-1]).tolist()
    return Update(float(sigma_t / sigma_s0), float(alpha_t * h_phi_1), float(alpha_t * b_h),
                  tuple(float(x) for x in rks), tuple(float(x) for x in rhos))


class UniPCStepper:
    """Steps one window's stacked latents through a `UniPCPlan` (the state of diffusers' scheduler, on device
    tensors only: past x0 predictions and the sample before the last predictor)."""

    def __init__(self, plan: UniPCPlan) -> None:
        self.plan = plan
        self.index = 0
        self._outputs: list[torch.Tensor] = []  # x0 predictions, newest last
        self._last_sample: torch.Tensor | None = None

    def step(self, velocity: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        """Args: velocity and sample ``[B, C, T, h, w]``. Returns the sample at the next sigma."""
        c = self.plan.steps[self.index]
        x0 = sample - c.sigma * velocity
        if c.corrector is not None and self._last_sample is not None:
            sample = _apply(c.corrector, self._last_sample, self._outputs, fresh=x0)
        self._outputs = [*self._outputs, x0][-self.plan.history:]
        self._last_sample = sample
        self.index += 1
        return _apply(c.predictor, sample, self._outputs)


def _apply(u: Update, x: torch.Tensor, outputs: list[torch.Tensor], fresh: torch.Tensor | None = None) -> torch.Tensor:
    """``u`` on sample ``x``; ``outputs[-1]`` is m0, ``outputs[-1 - k]`` the k-th older one."""
    m0 = outputs[-1]
    x_t = u.ratio * x - u.m0_coef * m0
    res = None
    for k, (rk, rho) in enumerate(zip(u.rks, u.rhos), start=1):
        term = rho * ((outputs[-1 - k] - m0) / rk)
        res = term if res is None else res + term
    if fresh is not None:  # the corrector's own term
        term = u.rhos[-1] * (fresh - m0)
        res = term if res is None else res + term
    return x_t if res is None else x_t - u.res_coef * res
