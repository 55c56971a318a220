"""Each subcommand's knobs as a dataclass; the CLI flags are generated from the fields (``worldstep.flags``).

Defaults are what the published figures use; `bench rollout`'s default finishes in under 3 minutes on 2 idle
CPU cores, and its long scans are flags. Tests shrink every size through the same flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..flags import flag, non_negative_int


@dataclass
class RolloutSettings:
    archs: list[str] = flag("architectures of the per-step comparison", default_factory=lambda: ["tiny", "small"])
    rounds: int = flag("measured env steps per alternative", default=6)
    warmup: int = flag("env steps run first and discarded", default=2, type=non_negative_int)
    num_steps: int = flag("denoise steps per window", default=4)
    context_frames: int = flag("committed latent frames kept in context (bounded context)", default=4)
    compare_size: int = flag("frame side of the per-step comparison (a pipeline canvas: 256)", default=256)
    scan_arch: str = flag("architecture of the windows 1..N scan and the pipelined rollout", default="tiny")
    scan_windows: int = flag("windows of one long session, timed one by one (e.g. 64; 0: skip)", default=0)
    scan_span: int = flag("windows in the early and the late group of the scan", default=16)
    pipeline_windows: int = flag("windows per open-loop rollout, pipelined vs sequential (e.g. 8; 0: skip)",
                                  default=0)
    pipeline_rounds: int = flag("measured rollouts per mode", default=3)
    cache_dir: str | None = flag("checkpoint cache (default $WORLDSTEP_CACHE or ~/.cache/worldstep)", default=None)


@dataclass
class DecodeSettings:
    height: int = flag("frame height (multiple of 16)", default=256)
    width: int = flag("frame width (multiple of 16)", default=256)
    window_latents: list[int] = flag("latents per decoded window, one row each", default_factory=lambda: [1, 2, 4])
    timed_windows: int = flag("timed windows per row (>= 3)", default=3)
    context_latents: int = flag("latents the stateless alternative re-decodes ahead of a window", default=8)
    base_dim: int = flag("VAE base_dim (Wan 2.2 family, z_dim 16, dim_mult 1,2,4,4)", default=32)


@dataclass
class VectorSettings:
    arch: str = flag("architecture: tiny, small or pusher (the shipped trained 64x64 model)", default="tiny")
    sizes: list[int] = flag("numbers of parallel sessions", default_factory=lambda: [1, 2, 4, 8])
    rounds: int = flag("measured steps per alternative and size", default=4)
    warmup: int = flag("steps run first and discarded", default=1, type=non_negative_int)
    num_steps: int = flag("denoise steps per window", default=4)
    context_frames: int = flag("committed latent frames kept in context", default=4)
    vector_env: bool = flag("also step worldstep.envs.WorldModelVectorEnv", default=True)
    cache_dir: str | None = flag("checkpoint cache", default=None)


@dataclass
class SoakSettings:
    arch: str = flag("architecture", default="tiny")
    windows: int = flag("windows of the one long rollout", default=500)
    context_frames: int = flag("committed latent frames kept in context", default=4)
    num_steps: int = flag("denoise steps per window", default=4)
    rss_from: int = flag("window from which RSS growth is measured (clamped to windows/2)", default=50)
    cache_dir: str | None = flag("checkpoint cache", default=None)


@dataclass
class GpuSettings:
    arch: str = flag("architecture (edge: Cosmos3-Edge at full size)", default="edge")
    sections: list[str] = flag("what to measure, in order: windows, sessions, official, backends, overlap, cadence, "
                                "ab, profile, decoder",
                                default_factory=lambda: ["windows", "sessions", "official", "backends"])
    attention_backend: str = flag("attention backend of the windows/sessions/official sections: auto, sdpa, "
                                   "flashinfer", default="auto")
    vae_dtype: str = flag("VAE dtype (float32: what load() gives users today; bfloat16)", default="float32")
    steps: list[int] = flag("denoise steps of the real-time-factor runs", default_factory=lambda: [4, 30])
    guidance: list[float] = flag("guidance scales (1 = no CFG)", default_factory=lambda: [1.0, 3.0])
    sessions: list[int] = flag("numbers of sessions stepped together (sessions section)",
                                default_factory=lambda: [1, 4, 8])
    session_steps: int = flag("denoise steps of the sessions and backends sections", default=4)
    context_frames: int = flag("committed latent frames kept in context (windows section; timed at full context)",
                                default=8)
    official_steps: int = flag("denoise steps of the official-recipe comparison", default=4)
    cadence_windows: int = flag("timed windows of the cadence section (at least 16, at full context)", default=16)
    height: int | None = flag("frame height (default: the arch's, 480 for edge)", default=None)
    width: int | None = flag("frame width (default: the arch's, 832 for edge)", default=None)
    windows: int = flag("measured windows per setting (windows section: at full context, after warm-up windows "
                         "fill it; sessions, backends: after one warm-up window)", default=5)
    peak_tflops: float | None = flag("device peak dense bf16 TFLOP/s (default: looked up by name)", default=None)
    allow_cpu: bool = flag("run on CPU anyway (tests: --arch tiny --allow-cpu)", default=False)
    partial_json: str | None = flag("also write the figures here after each section (kept if a run is cut)",
                                     default=None)
    ab_sessions: list[int] = flag("numbers of sessions of the ab section (today's path vs the new defaults)",
                                  default_factory=lambda: [1, 8])
    ab_rounds: int = flag("measured rounds per path of the ab and decoder sections", default=5)
    ab_warmup: int = flag("rounds run first and discarded (ab, decoder): they fill the context", default=2,
                          type=non_negative_int)
    profile_top: int = flag("events listed per path by the profile section", default=12)


@dataclass
class ProfileSettings:
    archs: list[str] = flag("architectures to profile", default_factory=lambda: ["tiny", "small"])
    windows: int = flag("profiled windows per architecture (after the context is full)", default=3)
    num_steps: int = flag("denoise steps per window", default=4)
    context_frames: int = flag("committed latent frames kept in context", default=4)
    top: int = flag("operators and functions listed per architecture", default=10)
    cache_dir: str | None = flag("checkpoint cache", default=None)


@dataclass
class ViewSettings:
    env: str = flag("gymnasium id of the env whose steps are logged", default="worldstep/Pusher-v0")
    windows: int = flag("measured windows (one episode)", default=12)
    warmup: int = flag("windows run first and not measured", default=2, type=non_negative_int)
    seed: int = flag("reset seed", default=0)
    image_format: str = flag("jpeg or png", default="jpeg")
