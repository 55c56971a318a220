"""The flags of ``worldstep rollout``, ``eval``, ``plan``, ``info`` and ``stats``, one dataclass each
(``worldstep.flags`` turns them into flags); ``ModelFlags`` are the model flags every command shares."""

from __future__ import annotations

from dataclasses import dataclass

from .flags import flag, positive_int
from .registration import WORLD_MODEL_IDS

DEFAULT_ENV = "worldstep/Tiny-v0"

_SUCCESS = ("success judge of each window: sim (the config's simulator's pixel judge; the default when the config "
            "names a simulator), none, or module:function (frames -> bool)")


@dataclass
class ModelFlags:
    """Which model, on which device, with which config overrides."""

    env: str = flag("registered env id whose config to use", default=DEFAULT_ENV, choices=sorted(WORLD_MODEL_IDS),
                    exclusive="model")
    config: str | None = flag("config name (tiny, pusher, cosmos3_edge), .yaml path, checkpoint folder or hub id",
                              default=None, exclusive="model")
    device: str | None = flag("auto, cpu, cuda or cuda:N (default: the config's)", default=None)
    set: list[str] = flag("override any config key, e.g. --set num_steps=2 or --set rollout.num_steps=2 "
                          "(repeatable)", default_factory=list, repeat=True, metavar="KEY=VALUE")


@dataclass
class RolloutFlags:
    """``worldstep rollout``."""

    policy: str = flag("sine, random, push (PushSim's pixel expert) or replay:PATH.npy", default="sine")
    windows: int = flag("windows to generate", default=8, type=positive_int)
    success: str | None = flag(_SUCCESS, default=None, metavar="JUDGE")
    truth: bool = flag("step the model's simulator (config env.simulator) with the same actions; the mp4 shows "
                       "model | simulator side by side and the summary holds PSNR per window", default=False)
    out: str = flag("mp4 path", default="rollout.mp4")
    summary: str | None = flag("JSON summary path (default: --out with .json)", default=None)
    lerobot_out: str | None = flag("also write the episode as a LeRobot v3.0 dataset in this new folder",
                                   default=None, metavar="DIR")
    seed: int = flag("reset seed", default=0)
    prompt: str | None = flag("text prompt (default: the config's)", default=None)
    embodiment: str | None = flag("embodiment name, e.g. droid_lerobot (the README's embodiment table; default: the "
                                  "config's)", default=None)
    domain_id: int | None = flag("action-head domain (default: the config's)", default=None)
    image: str | None = flag("first frame image path (default: the simulator's scene for --seed, else a drawn "
                             "tabletop scene)", default=None)
    quiet: bool = flag("no progress bar", default=False)


@dataclass
class EvalFlags:
    """``worldstep eval``."""

    episodes: str = flag("YAML: a list of episodes (seed, prompt, domain_id, image, max_windows, start) or a mapping "
                         "with an 'episodes' list; or a LeRobot dataset folder, whose recorded starts are the episodes",
                         positional=True)
    starts: int | None = flag("with a dataset: this many (episode, frame) starts drawn from --seed (default: frame 0 "
                              "of every episode)", default=None, type=positive_int)
    policy: str = flag("sine, random, push or replay:PATH.npy", default="sine")
    success: str | None = flag(_SUCCESS, default=None, metavar="JUDGE")
    out_dir: str = flag("report and video folder", default="runs/eval")
    batched: bool = flag("step episodes together in one vector env", default=False)
    batch_size: int | None = flag("episodes per batch (default: all)", default=None, type=positive_int)
    seed: int = flag("seed of episodes without one: seed + index", default=0)
    video: bool = flag("write an mp4 per episode (--no-video skips them)", default=True)
    lerobot_out: str | None = flag("also write the episodes as a LeRobot v3.0 dataset in this new folder (not with "
                                   "--ray)", default=None, metavar="DIR")
    quiet: bool = flag("no progress bar", default=False)
    ray: bool = flag("shard episodes over Ray actors, one model each (pip install 'worldstep[dist]')", default=False)
    ray_address: str | None = flag("Ray cluster to join (default: $RAY_ADDRESS, else a new local one)", default=None)
    workers: int = flag("Ray actors with --ray", default=2, type=positive_int)


@dataclass
class PlanFlags:
    """``worldstep plan`` (its model flags default to ``--env worldstep/Pusher-v0``)."""

    proposal: str = flag("graded pusher policy whose chunks the planner scores (see "
                         "worldstep.fidelity.policies.graded_policies)", default="noisy0.8")
    candidates: int = flag("chunks imagined per window", default=8, type=positive_int)
    approach_weight: float = flag("weight of the effector-to-block distance in the cost", default=0.0)
    observe: str = flag("model: act on imagined frames, the simulator replays; simulator: re-anchor the model on the "
                        "simulator's frame every window (MPC)", default="model", choices=("model", "simulator"))
    windows: int = flag("windows per episode", default=16, type=positive_int)
    seed: int = flag("reset seed", default=0)
    compare: bool = flag("also run the proposal policy alone on the simulator", default=False)
    out: str = flag("mp4: what the planner saw | simulator", default="plan.mp4")
    summary: str | None = flag("JSON summary path (default: --out with .json)", default=None)


@dataclass
class InfoFlags:
    """``worldstep info``."""

    windows: int = flag("episode length for the plan", default=32, type=positive_int)
    context_frames: int | None = flag("committed latent frames kept in context (default: the config's)",
                                      default=None)
    text_tokens: int = flag("prompt tokens assumed when the checkpoint cannot be loaded", default=256,
                            type=positive_int)
    json: bool = flag("print JSON", default=False)


@dataclass
class StatsFlags:
    """``worldstep stats``."""

    source: str = flag(".npy, .npz, a .parquet file or a LeRobot dataset folder (data/**/*.parquet)",
                       positional=True)
    column: str = flag("parquet column holding the actions", default="action")
    key: str | None = flag(".npz array name (default actions, action or the only array)", default=None)
    dims: str | None = flag("keep dimensions START:STOP, e.g. 0:10", default=None)
    out: str | None = flag("write the stats JSON (cosmos-framework's normalizer-stats format) here", default=None)
    json: bool = flag("print the stats JSON instead of a table", default=False)


__all__ = ["DEFAULT_ENV", "EvalFlags", "InfoFlags", "ModelFlags", "PlanFlags", "RolloutFlags", "StatsFlags"]
