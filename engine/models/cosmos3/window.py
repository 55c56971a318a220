"""One window for a group of sessions: denoise, then commit (the adapter's `WindowOps`). Decoding is the loop's.

All rows (a session's ``main`` and, under CFG, ``uncond`` stream) are packed into one token sequence, so
every denoise step is ONE forward of the generation layers for the whole group; each row's queries attend
to its own committed context through the paged attention backend. The sessions of a group share their step
count, shift and window shape (`group_key`), so one UniPC stepper steps their stacked latents: its update
is elementwise per sample, so each row gets exactly what a stepper of its own would give it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from ...attention import AttentionBackendName, AttentionForward, PagedAttentionBatch, prime
from ...flashinfer_kernels import FlashinferKernels
from ...graphs import GraphCache, GraphedSteps
from ...kv import PagedKVCache, StreamLabel
from ...scheduler import ScheduledWindow
from ...session import RolloutSession, SessionClosedError
from ...spec import ModelSpec, window_tokens
from ...windowing import WindowPlan
from .fused import gen_weights
from .layers import gen_forward, gen_layers, rotary
from .layout import action_positions, media_offset, vision_positions
from .tokens import action_tokens, embed_timesteps, unpatchify, vision_tokens
from .unipc import UniPCStepper, unipc_plan

denoise_loop_guard = nullcontext
"""Entered around a window's denoise loop and nothing else: a test swaps in a guard that refuses host syncs."""


@dataclass(frozen=True)
class WindowContext:
    """What a window needs of the loaded model and the loop's parts (`adapter.LoopParts`), handed down as
    arguments: the adapter bound to the loop (`adapter.WindowOps`)."""

    transformer: nn.Module
    cache: PagedKVCache
    backend: AttentionBackendName
    spec: ModelSpec
    unipc_config: dict[str, Any]  # the checkpoint's scheduler/scheduler_config.json (UniPC's noise schedule)
    native_flow_schedule: bool
    device: torch.device
    dtype: torch.dtype
    kernels: FlashinferKernels | None = None  # the model's, when its backend is flashinfer
    graphs: GraphCache | None = None  # the loop's captured denoise steps and commits, with `cuda_graphs` (graphs.py)

    def denoise(self, group: Sequence[ScheduledWindow[RolloutSession]]) -> DenoisedWindow:
        """Denoise one scheduled group's windows as one batched window (no wait for the device).

        Args:
            group: windows of open sessions with equal `RolloutSession.group_key` (the scheduler grouped them by it),
                admitted into the page pool; their ``actions`` are ``[chunk, width]`` float32, already checked.
        """
        jobs = [_prepare(self, w.session, w.plan, w.actions) for w in group]
        rows = [(job, label) for job in jobs for label in job.session.labels]
        tables = [self.cache.page_table(k) for job in jobs for k in job.session.keys]
        batch = PagedAttentionBatch(self.cache, tables, [job.num_tokens for job, _ in rows], self.backend, self.kernels)
        rotaries = [_row_rotary(self, job, label) for job, label in rows]
        cos, sin = torch.cat([c for c, _ in rotaries]), torch.cat([s for _, s in rotaries])
        graphed, forward = _denoise(self, jobs, batch, cos, sin)
        return DenoisedWindow(jobs, batch, cos, sin, graphed, forward)

    def commit(self, window: DenoisedWindow) -> None:
        """In kv mode, append each row's clean-window K/V to its streams and release beyond the horizon (see `_commit`);
        chained windows commit nothing."""
        if window.jobs[0].session.knobs.window_mode == "kv":
            _commit(self, window)


@dataclass
class _Job:
    """What one session contributes to the window."""

    session: RolloutSession
    plan: WindowPlan  # its window, resolved once by the scheduler
    latents: torch.Tensor  # [C, T, h, w] window tensor, leading `clean` frames fixed
    clean: int  # clean leading frames (conditioning), velocity masked to zero
    action_tokens: torch.Tensor  # [A, hidden]
    num_tokens: int  # vision + action tokens of one row


@dataclass
class DenoisedWindow:
    """A group's window after its denoise loop, before its commit: what the commit pass needs."""

    jobs: list[_Job]
    batch: PagedAttentionBatch
    cos: torch.Tensor  # [N, head_dim]
    sin: torch.Tensor
    graphed: GraphedSteps | None  # the graph the denoise replayed (its commit graph commits), or None
    forward: AttentionForward | None  # the batch primed once, before the denoise loop (eager), or None (graphed)

    @property
    def latents(self) -> list[torch.Tensor]:
        """Per window its new latents ``[C, n, h, w]``, float32, on the device (the commit leaves them as they are)."""
        return [job.latents[:, job.clean:].float() for job in self.jobs]


def _prepare(ctx: WindowContext, session: RolloutSession, plan: WindowPlan, actions: np.ndarray) -> _Job:
    spec = session.spec
    shape = (1, spec.latent_channels, plan.units, spec.latent_height, spec.latent_width)
    noise = torch.randn(shape, generator=session.generator, dtype=torch.float32)[0].to(ctx.device)
    clean = plan.cond_units
    if clean:
        cond = session.first_latent if plan.index == 0 else session.last_latents[:, -clean:]
        noise[:, :clean] = cond.to(ctx.device)
    padded = torch.zeros(actions.shape[0], spec.action_dim)  # zero-padded to the action head, as the pipeline
    padded[:, : actions.shape[1]] = torch.from_numpy(actions)
    tokens = action_tokens(ctx.transformer, padded.to(ctx.device), session.domain_id)
    return _Job(session, plan, noise, clean, tokens, window_tokens(plan.units, spec.tokens_per_frame, tokens.shape[0]))


def _row_rotary(ctx: WindowContext, job: _Job, label: StreamLabel) -> tuple[torch.Tensor, torch.Tensor]:
    session, spec, config = job.session, job.session.spec, ctx.transformer.config
    offset = media_offset(session.text_lens[label], config.unified_3d_mrope_temporal_modality_margin)
    timing = dict(offset=offset, fps=session.conditioning.fps, base_fps=float(config.base_fps),
                  temporal_compression=spec.temporal_compression)
    plan = job.plan
    vision = vision_positions(plan.start, plan.end, *spec.patch_grid, **timing)
    acts = action_positions(*session.action_span(plan), **timing)
    return rotary(ctx.transformer, torch.cat([vision, acts], dim=1), ctx.dtype)  # [N, D] each


def _hidden(ctx: WindowContext, jobs: list[_Job], timestep: float | None,
            latents: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The rows' input tokens: each job's latents (or `latents`, one `[C, T, h, w]` per job), its frames from
    `job.clean` on given `timestep`'s embedding (None: none, a clean commit), then its action tokens."""
    rows = []
    temb = None  # [1, hidden], once for every row
    if timestep is not None:
        temb = embed_timesteps(ctx.transformer, torch.full((1,), float(timestep), device=ctx.device)).to(ctx.dtype)
    for i, job in enumerate(jobs):
        frames = job.latents if latents is None else latents[i]
        noisy_from = job.clean if timestep is not None else frames.shape[1]
        vision = vision_tokens(ctx.transformer, frames, noisy_from, temb)
        row = torch.cat([vision, job.action_tokens], dim=0)  # [N_row, hidden]
        rows.extend([row] * len(job.session.labels))
    return torch.cat(rows, dim=0)


def _velocity(ctx: WindowContext, job: _Job, out: torch.Tensor) -> torch.Tensor:
    """Row output `[N_row, hidden]` -> velocity `[C, T, h, w]`, zero on the clean frames."""
    spec, patch = job.session.spec, ctx.transformer.config.latent_patch_size
    frames = job.latents.shape[1]
    start, end = job.clean * spec.tokens_per_frame, frames * spec.tokens_per_frame
    noisy = unpatchify(ctx.transformer.proj_out(out[start:end]), frames - job.clean,
                       spec.latent_height, spec.latent_width, spec.latent_channels, patch)
    velocity = torch.zeros_like(job.latents)
    velocity[:, job.clean:] = noisy.float()
    return velocity


def _denoise(ctx: WindowContext, jobs: list[_Job], batch: PagedAttentionBatch, cos,
             sin) -> tuple[GraphedSteps | None, AttentionForward | None]:
    """The loop of denoise steps; returns the graph it replayed, or the batch's one `prime` (eager), which every
    forward of the window reuses: its tables cannot change before the commit."""
    knobs = jobs[0].session.knobs  # the UniPC schedule: computed once per (steps, shift), on the host
    plan = unipc_plan(ctx.unipc_config, knobs.num_steps, knobs.flow_shift, ctx.native_flow_schedule)
    stepper = UniPCStepper(plan)
    graphed, forward = None, None  # gathers or plans (or binds a graph) before the loop: no host copies inside it
    if ctx.graphs is not None:
        policies = [job.session.retention[label] for job in jobs for label in job.session.labels]
        transformer = ctx.transformer
        graphed = ctx.graphs.steps(partial(gen_layers, transformer), partial(gen_weights, transformer),
                                   transformer.config.hidden_size, cos, sin, batch, policies)
    else:
        forward = prime(batch, ctx.transformer.config.num_attention_heads)
    with denoise_loop_guard():
        for step in plan.timesteps:  # host floats
            _denoise_step(ctx, jobs, batch, cos, sin, graphed, forward, stepper, step)
    return graphed, forward


def _denoise_step(ctx: WindowContext, jobs: list[_Job], batch: PagedAttentionBatch, cos, sin,
                  graphed: GraphedSteps | None, forward: AttentionForward | None, stepper: UniPCStepper,
                  step: float) -> None:
    hidden = _hidden(ctx, jobs, step)
    if graphed is not None:
        out = graphed(hidden)
    else:
        out = gen_forward(ctx.transformer, hidden, cos, sin, batch, forward=forward).hidden
    offset, velocity = 0, []
    for job in jobs:
        rows = []
        for _ in job.session.labels:
            rows.append(_velocity(ctx, job, out[offset: offset + job.num_tokens]))
            offset += job.num_tokens
        if len(rows) == 2:  # text-only CFG: v = v_u + g (v_c - v_u)
            rows[0] = rows[1] + job.session.knobs.guidance_scale * (rows[0] - rows[1])
        velocity.append(rows[0])
    stacked = torch.stack([job.latents for job in jobs])
    stepped = stepper.step(torch.stack(velocity), stacked)
    for row, job in enumerate(jobs):
        job.latents = stepped[row]
    closed = [job.session.session_id for job in jobs if job.session.abort.is_set()]
    if closed:  # stop before the commit: nothing of this window reached any stream
        raise SessionClosedError(f"session(s) {', '.join(closed)} closed while a window was running")


def _commit(ctx: WindowContext, window: DenoisedWindow) -> None:
    """Append each row's clean-window K/V (no timestep embedding; with the ``context_noise`` knob, the window
    noised at that level and given it as its timestep), then release beyond the horizon. The commit pass replays
    the commit graph of the denoise's geometry when the denoise replayed one (its context is still bound)."""
    jobs = window.jobs
    for job in jobs:
        if job.plan.index == 0:  # the conditioning frame is known exactly
            job.latents[:, :1] = job.session.first_latent.to(job.latents.device)
    level = jobs[0].session.knobs.context_noise  # one per group (group_key)
    if level > 0:
        timestep = level * ctx.unipc_config["num_train_timesteps"]  # the scale of the denoise steps' timesteps
        hidden = _hidden(ctx, jobs, timestep, [_noised(job, level) for job in jobs])
    else:
        hidden = _hidden(ctx, jobs, None)
    if window.graphed is not None:
        out = window.graphed.commit(hidden)
    else:
        out = gen_forward(ctx.transformer, hidden, window.cos, window.sin, window.batch, collect_kv=True,
                          forward=window.forward)
    offset = 0
    for job in jobs:
        session = job.session
        for key in session.keys:
            end = offset + job.num_tokens
            ctx.cache.append(key, out.keys[:, offset:end], out.values[:, offset:end])
            ctx.cache.apply_retention(key, session.retention[key.label])
            offset = end


def _noised(job: _Job, level: float) -> torch.Tensor:
    """`[C, T, h, w]`: the window's latents, frames past its clean ones at flow level `level`, `(1 - s) x + s eps`,
    with noise from the session's generator (the latents the window returns stay clean)."""
    eps = torch.randn(job.latents.shape, generator=job.session.generator, dtype=torch.float32).to(job.latents.device)
    noised = (1 - level) * job.latents + level * eps
    noised[:, :job.clean] = job.latents[:, :job.clean]
    return noised
