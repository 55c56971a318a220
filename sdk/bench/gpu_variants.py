"""`bench gpu`'s two paths, as config overrides: today's (what the H200's first run measured) and the new defaults.

Each path is a set of dotted config keys (`worldstep --set` spelling). They go through the shipped Edge config
(`with_overrides`), so a key or value the config does not take is refused by the config's own check, then into
a `Cosmos3WorldModel` over the bench's in-memory modules the way `worldstep.load` passes them
(``decoder`` as `DecoderOptions`, ``model.*`` as constructor keywords).

On CUDA every knob must be taken: the A/B measures what it names or fails. On a CPU (the kit's dry run, tests with
``--allow-cpu``) a knob the config or the engine refuses here (``model.cuda_graphs`` is CUDA-only) is left at
the config's value and named under ``refused`` with the reason, so the same code path runs end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

TODAY: dict[str, Any] = {
    "decoder.dtype": "float32", "decoder.channels_last": False, "decoder.cudnn_benchmark": False,
    "model.cuda_graphs": False, "model.decode_after_denoise": False,
}
NEW: dict[str, Any] = {
    "decoder.dtype": "auto", "decoder.channels_last": "auto", "decoder.cudnn_benchmark": "auto",
    "model.cuda_graphs": True, "model.decode_after_denoise": True,
}
PATHS: dict[str, dict[str, Any]] = {"today": TODAY, "new": NEW}
SECTIONS = ("model", "decoder")  # the config sections a path may set


@dataclass
class Variant:
    """One path as built: the knobs taken, the ones refused here (key -> why) and the attention backend."""

    name: str
    knobs: dict[str, Any]
    backend: str
    refused: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"knobs": self.knobs, "backend": self.backend, "refused": self.refused, "notes": self.notes}


def split_key(key: str) -> tuple[str, str]:
    """``"decoder.dtype"`` -> ``("decoder", "dtype")``; a section other than `SECTIONS` is a ValueError."""
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name:
        raise ValueError(f"knob {key!r} is invalid; allowed: 'model.<key>' or 'decoder.<key>'")
    return section, name


def nested(knobs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Dotted keys as `with_overrides` sections: ``{"decoder.dtype": x}`` -> ``{"decoder": {"dtype": x}}``."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in knobs.items():
        section, name = split_key(key)
        out.setdefault(section, {})[name] = value
    return out


def configured(knobs: dict[str, Any], base: str = "cosmos3_edge"):
    """The shipped config with ``knobs`` applied (its own check refuses an unknown key or a bad value)."""
    from worldstep.config import load_config

    return load_config(base).with_overrides(**nested(knobs))


def model_kwargs(knobs: dict[str, Any], base: str = "cosmos3_edge") -> dict[str, Any]:
    """`Cosmos3WorldModel` keywords of a path: its config's decoder section, and each ``model.*`` knob by name."""
    config = configured(knobs, base)
    kwargs: dict[str, Any] = {"decoder": config.decoder}
    for key in knobs:
        section, name = split_key(key)
        if section == "model":
            kwargs[name] = getattr(config.model, name)
    return kwargs


def graph_backend(backend: str, device: torch.device) -> tuple[str, str | None]:
    """The attention backend a CUDA-graphs path runs on: ``backend`` where the engine captures graphs with it,
    else sdpa (which it does), and the reason."""
    from worldstep.engine.attention import AttentionBackendName
    from worldstep.engine.graphs import check_cuda_graphs

    if device.type != "cuda" or backend == "sdpa":
        return backend, None
    try:
        check_cuda_graphs(True, device, AttentionBackendName(backend))
    except ValueError as err:
        return "sdpa", f"cuda_graphs on sdpa: {err}"
    return backend, None


def build(name: str, knobs: dict[str, Any], make_model, backend: str, device: torch.device,
          tolerate: bool) -> tuple[Any, Variant]:
    """A model of one path: ``make_model(backend, **kwargs)``; refusals tolerated only when ``tolerate`` (module
    docstring), each knob then tried on its own in order (the config's check, then the constructor)."""
    notes = []
    if knobs.get("model.cuda_graphs") is True:
        backend, note = graph_backend(backend, device)
        notes += [note] if note else []
    if not tolerate:
        return make_model(backend, **model_kwargs(knobs)), Variant(name, dict(knobs), backend, notes=notes)
    taken: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for key, value in knobs.items():
        trial = {**taken, key: value}
        try:
            make_model(backend, **model_kwargs(trial))
        except (ValueError, TypeError) as err:  # pydantic's ValidationError is a ValueError
            refused[key] = f"{type(err).__name__}: {str(err).splitlines()[0]}"[:300]
            continue
        taken = trial
    return make_model(backend, **model_kwargs(taken)), Variant(name, taken, backend, refused, notes)
