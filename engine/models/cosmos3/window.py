"""One window for a batch of sessions: denoise, commit, decode.

All rows (a session's `main` and, under CFG, `uncond` stream) are packed into one token sequence,
so every denoise step is ONE forward of the generation layers for the whole batch; each row's
queries attend to its own committed context through the paged attention backend.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ...attention import PagedAttentionBatch
from ...windowing import WindowSchedule
from .layout import action_positions, media_offset, vision_positions
from .runner import gen_forward, rotary
from .session import RolloutSession, SessionClosedError
from .spec import PhaseTimings, WindowResult
from .tokens import embed_actions, embed_vision, project_out, timestep_embedding, unpatchify


@dataclass
class _Job:
    """What one session contributes to the window."""

    session: RolloutSession
    latents: torch.Tensor  # [C, T, h, w] window tensor, leading `clean` frames fixed
    clean: int  # clean leading frames (the conditioning frame), velocity masked to zero
    action_tokens: torch.Tensor  # [A, hidden]
    frame_range: tuple[int, int]
    num_tokens: int  # vision + action tokens of one row


def _pad_actions(actions: np.ndarray, action_dim: int, device) -> torch.Tensor:
    padded = np.zeros((actions.shape[0], action_dim), dtype=np.float32)
    padded[:, : actions.shape[1]] = actions
    return torch.from_numpy(padded).to(device)


def _prepare(model, session: RolloutSession, actions: np.ndarray) -> _Job:
    start, end, clean = session.window_frames()
    spec = model.spec
    shape = (1, spec.latent_channels, end - start, spec.latent_height, spec.latent_width)
    noise = torch.randn(shape, generator=session.generator, dtype=torch.float32)[0].to(model.device)
    if clean:
        cond = session.first_latent if session.window_index == 0 else session.last_latents[:, -1:]
        noise[:, :1] = cond.to(model.device)
    tokens = embed_actions(model.transformer, _pad_actions(actions, spec.action_dim, model.device), session.domain_id)
    return _Job(session, noise, clean, tokens, (start, end), (end - start) * spec.tokens_per_frame + tokens.shape[0])


def _row_rotary(model, job: _Job, label: str) -> tuple[torch.Tensor, torch.Tensor]:
    session, spec, config = job.session, model.spec, model.transformer.config
    offset = media_offset(session.text_lens[label], config.unified_3d_mrope_temporal_modality_margin)
    grid_h, grid_w = model.patch_grid
    vision = vision_positions(*job.frame_range, grid_h, grid_w, offset=offset, fps=spec.fps,
                              base_fps=float(config.base_fps), temporal_compression=spec.temporal_compression)
    acts = action_positions(*session.window_actions(), offset=offset, fps=spec.fps,
                            base_fps=float(config.base_fps), temporal_compression=spec.temporal_compression)
    return rotary(model.transformer, torch.cat([vision, acts], dim=1), model.dtype)  # [N, D] each


def _hidden(model, jobs: list[_Job], timestep: float | None) -> torch.Tensor:
    rows = []
    temb = None if timestep is None else timestep_embedding(model.transformer, timestep, model.device, model.dtype)
    for job in jobs:
        noisy_from = job.clean if timestep is not None else job.latents.shape[1]
        vision = embed_vision(model.transformer, job.latents, noisy_from, timestep, temb)
        row = torch.cat([vision, job.action_tokens], dim=0)  # [N_row, hidden]
        rows.extend([row] * len(job.session.labels))
    return torch.cat(rows, dim=0)


def _velocity(model, job: _Job, out: torch.Tensor) -> torch.Tensor:
    """Row output `[N_row, hidden]` -> velocity `[C, T, h, w]`, zero on the clean frames."""
    spec, patch = model.spec, model.transformer.config.latent_patch_size
    frames = job.latents.shape[1]
    start, end = job.clean * spec.tokens_per_frame, frames * spec.tokens_per_frame
    noisy = unpatchify(project_out(model.transformer, out[start:end]), frames - job.clean,
                       spec.latent_height, spec.latent_width, spec.latent_channels, patch)
    velocity = torch.zeros_like(job.latents)
    velocity[:, job.clean:] = noisy.float()
    return velocity


def _scheduler_groups(jobs: list[_Job]) -> list[list[int]]:
    """Jobs whose scheduler steps can run as one batched step: same window shape, clean frames and schedule.

    UniPC's update is elementwise per sample, so stepping `[B, ...]` stacked latents with one scheduler
    gives each row exactly what its own scheduler would (each session's scheduler is reset every window,
    so the group's lead carries the shared multistep history for this window only).
    """
    groups: dict[tuple, list[int]] = {}
    for i, job in enumerate(jobs):
        knobs = job.session.knobs
        key = (tuple(job.latents.shape), job.clean, knobs.num_steps, float(knobs.flow_shift))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _denoise(model, jobs: list[_Job], batch: PagedAttentionBatch, cos, sin) -> None:
    timesteps = jobs[0].session.scheduler.timesteps
    groups = _scheduler_groups(jobs)
    for t in timesteps:
        out = gen_forward(model.transformer, _hidden(model, jobs, t.item()), cos, sin, batch).hidden
        offset, velocity = 0, []
        for job in jobs:
            rows = []
            for _ in job.session.labels:
                rows.append(_velocity(model, job, out[offset: offset + job.num_tokens]))
                offset += job.num_tokens
            if len(rows) == 2:  # text-only CFG: v = v_u + g (v_c - v_u)
                rows[0] = rows[1] + job.session.knobs.guidance_scale * (rows[0] - rows[1])
            velocity.append(rows[0])
        for group in groups:
            lead = jobs[group[0]].session.scheduler
            stacked = torch.stack([jobs[i].latents for i in group])
            stepped = lead.step(torch.stack([velocity[i] for i in group]), t, stacked, return_dict=False)[0]
            for row, i in enumerate(group):
                jobs[i].latents = stepped[row]
        closed = [job.session.session_id for job in jobs if job.session.abort.is_set()]
        if closed:  # stop before the commit: nothing of this window reached any stream
            raise SessionClosedError(f"session(s) {', '.join(closed)} closed while a window was running")


def _commit(model, jobs: list[_Job], batch: PagedAttentionBatch, cos, sin) -> None:
    """Append each row's clean-window K/V (no timestep embedding), then release beyond the horizon."""
    for job in jobs:
        if job.session.window_index == 0:  # the conditioning frame is known exactly
            job.latents[:, :1] = job.session.first_latent.to(job.latents.device)
    out = gen_forward(model.transformer, _hidden(model, jobs, None), cos, sin, batch, collect_kv=True)
    offset = 0
    for job in jobs:
        session = job.session
        schedule = WindowSchedule(None, session.knobs.latents_per_window, context_units=session.knobs.context_frames)
        for key in session.stream_keys():
            end = offset + job.num_tokens
            model.kv.append(key, out.keys[:, offset:end], out.values[:, offset:end])
            policy = schedule.retention(model.spec.tokens_per_frame + 4, session.text_lens[key[1]])
            model.kv.apply_retention(key, policy)
            offset = end


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_window(
    model, sessions: list[RolloutSession], actions: list[np.ndarray], decode: bool = True
) -> list[WindowResult]:
    """Generate the next window of every session in one batched pass (sessions share step count and shift).

    With `decode=False` the frames are left to the caller (`model.decode_windows`), which lets a
    pipelined rollout decode window k while window k+1 denoises.
    """
    jobs = [_prepare(model, s, a) for s, a in zip(sessions, actions)]
    for job in jobs:
        model.set_window_timesteps(job.session)
    rows = [(job, label) for job in jobs for label in job.session.labels]
    tables = [model.kv.page_table((job.session.session_id, label)) for job, label in rows]
    batch = PagedAttentionBatch(model.kv, tables, [job.num_tokens for job, _ in rows], model.backend)
    tables_rot = [_row_rotary(model, job, label) for job, label in rows]
    cos, sin = torch.cat([c for c, _ in tables_rot]), torch.cat([s for _, s in tables_rot])

    t0 = time.perf_counter()
    _denoise(model, jobs, batch, cos, sin)
    _sync(model.device)
    t1 = time.perf_counter()
    if sessions[0].knobs.window_mode == "kv":
        _commit(model, jobs, batch, cos, sin)
        _sync(model.device)
    t2 = time.perf_counter()
    new_latents = [job.latents[:, job.clean:].float() for job in jobs]  # [C, n, h, w] each
    frames = model.decode_windows(sessions, new_latents) if decode else [None] * len(sessions)
    t3 = time.perf_counter()
    return [_finish(job, latents, window_frames, PhaseTimings(t1 - t0, t2 - t1, t3 - t2))
            for job, latents, window_frames in zip(jobs, new_latents, frames)]


def _finish(job: _Job, latents: torch.Tensor, frames, timings: PhaseTimings) -> WindowResult:
    session = job.session
    chunk = session.knobs.chunk_size
    index = session.window_index
    session.last_latents = latents
    session.window_index += 1
    return WindowResult(
        window_index=index,
        latents=latents.cpu(),
        frames=frames,
        frame_start=1 + index * chunk,
        frame_end=1 + (index + 1) * chunk,
        timings=timings,
        kv=session.kv_stats(),
    )
