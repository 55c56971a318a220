"""What a session is conditioned on besides its prompt and first frame: the action head's domain, the exact
width of the actions each step passes, the fps of its positions and caption, and the caption's view point.

Two ways in, both checked before any model work:

* an embodiment (a registered name, or a domain id whose embodiments share one width): the domain and the
  exact raw width are the embodiment's (zero-padded to the model's ``action_dim`` inside the window, as the
  pipeline does); fps is the explicit one, else the embodiment's ``default_fps``, else the checkpoint's;
  the view point is the knobs' explicit one, else the embodiment's ``default_view_point``;
* a bare ``domain_id`` (a raw domain, e.g. a checkpoint trained from scratch): any width up to
  ``action_dim``, the checkpoint's fps, the ego view unless the knobs say otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import check_fps, check_int, is_int
from ..config import RolloutKnobs
from ..spec import ModelSpec
from .embodiment import Embodiment
from .embodiments import EmbodimentRegistry

DEFAULT_VIEW_POINT = "ego_view"


@dataclass(frozen=True)
class Conditioning:
    """A session's checked conditioning: domain id, exact action width, fps, view point and embodiment."""

    domain_id: int
    action_width: int
    fps: float
    view_point: str
    embodiment: Embodiment | None = None

    def check_domain(self, domain_id: int) -> None:
        """A ValueError when ``domain_id`` (e.g. a reset's) is not this record's: the record is resolved once,
        and a later request may only repeat its domain."""
        if domain_id != self.domain_id:
            who = self.embodiment.describe() if self.embodiment is not None else f"domain {self.domain_id}"
            raise ValueError(f"domain_id={domain_id!r} contradicts embodiment {who}; allowed: "
                             f"domain_id={self.domain_id} or None")


def resolve_conditioning(registry: EmbodimentRegistry, spec: ModelSpec, knobs: RolloutKnobs, *,
                         embodiment: str | int | None = None, domain_id: int | None = None,
                         action_width: int | None = None, fps: float | None = None) -> Conditioning:
    """Check a caller's combination against the checkpoint's embodiments and action head.

    Args:
        embodiment: a registered name, or a domain id whose embodiments share one width; None for a raw domain.
        domain_id: with an embodiment, must equal its id (or None); without one, the raw domain (required).
        action_width: with an embodiment, must equal its raw width (or None); without one, 1..action_dim
            (None: action_dim).
        fps: the rate of the actions and frames (None: the embodiment's, else the checkpoint's).
    """
    fps = None if fps is None else check_fps("fps", fps)
    if embodiment is None:
        if domain_id is None:
            raise ValueError(f"embodiment=None and domain_id=None: give one; allowed embodiments: "
                             f"{sorted(registry.names)}")
        domain = check_int("domain_id", domain_id, 0, spec.num_domains)
        width = check_int("action_width", spec.action_dim if action_width is None else action_width, 1,
                          spec.action_dim + 1)
        return Conditioning(domain, width, fps or spec.fps, knobs.view_point or DEFAULT_VIEW_POINT)
    if is_int(embodiment):
        if domain_id is not None and domain_id != embodiment:
            raise ValueError(f"domain_id={domain_id!r} contradicts embodiment={embodiment!r}; allowed: "
                             f"domain_id={embodiment} or None")
        name, domain_id = None, int(embodiment)
    elif isinstance(embodiment, str):
        name = embodiment
    else:
        raise ValueError(f"embodiment={embodiment!r} is invalid; allowed: one of {sorted(registry.names)}, a "
                         "domain id, or None")
    found = registry.resolve(name, domain_id=domain_id, num_domains=spec.num_domains, action_dim=spec.action_dim)
    if action_width is not None and (not is_int(action_width) or action_width != found.raw_width):
        same = sorted(e.name for e in registry if e.raw_width == action_width)
        hint = f"; {action_width}-wide embodiments: {same}" if same else ""
        raise ValueError(f"action_width={action_width!r} is invalid: actions {action_width!r} wide do not fit "
                         f"embodiment {found.describe()}: it takes exactly {found.raw_width}{hint}; allowed: "
                         f"action_width={found.raw_width} or None; allowed names: {sorted(registry.names)}")
    return Conditioning(found.domain_id, found.raw_width, fps or found.default_fps or spec.fps,
                        knobs.view_point or found.default_view_point, found)


def env_embodiment(registry: EmbodimentRegistry, spec: ModelSpec | None, embodiment: str | int | None,
                   domain_id: int | None) -> tuple[str | int, int | None]:
    """The embodiment an env resolves (an env always has one), as ``(embodiment, domain_id)``: a bare domain id
    stands for its embodiment, as in the pipeline; given neither, the checkpoint's only embodiment that fits
    its action head (``spec``; None: the registry's only one), else a ValueError naming the choices."""
    if embodiment is not None:
        return embodiment, domain_id
    if domain_id is not None:
        return domain_id, None
    fitting = [e.name for e in registry] if spec is None else [
        e.name for e in registry.within(spec.num_domains) if e.raw_width <= spec.action_dim]
    if len(fitting) != 1:
        raise ValueError(f"embodiment=None and domain_id=None: give one; allowed names: {sorted(fitting)}")
    return fitting[0], None


def resolve_env_conditioning(registry: EmbodimentRegistry, spec: ModelSpec, knobs: RolloutKnobs, *,
                             embodiment: str | int | None = None, domain_id: int | None = None,
                             action_width: int | None = None, fps: float | None = None) -> Conditioning:
    """`resolve_conditioning` of the embodiment an env resolves (`env_embodiment`): the one definition the
    env, the vector env and the sdk ask."""
    embodiment, domain_id = env_embodiment(registry, spec, embodiment, domain_id)
    return resolve_conditioning(registry, spec, knobs, embodiment=embodiment, domain_id=domain_id,
                                action_width=action_width, fps=fps)


def embodiment_width(registry: EmbodimentRegistry, embodiment: str | int | None, domain_id: int | None) -> int:
    """The raw action width of the embodiment an env resolves, from a registry alone (no model loaded)."""
    embodiment, domain_id = env_embodiment(registry, None, embodiment, domain_id)
    if is_int(embodiment):
        return registry.resolve(domain_id=int(embodiment)).raw_width
    return registry.resolve(embodiment, domain_id=domain_id).raw_width
