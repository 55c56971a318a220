"""`bench gpu` section `official`: NVIDIA's diffusers recipe next to worldstep's env step, same GPU and modules.

The recipe (`official.py`) runs `Cosmos3OmniPipeline` once per chunk on the last generated frame (encode,
denoise the whole clip with the text pathway at every step, decode the whole clip); worldstep steps one
session. Both use the same in-memory transformer, VAE, tokenizer and scheduler config, the same first
frame, prompt, actions, step count and no CFG; each discards its first chunk (warm-up).
"""

from __future__ import annotations

from typing import Any

from .archs import PROMPT, action_chunks, first_frame
from .gpu_model import open_sessions
from .measure import SyncedStopwatch, device_sync, median, ratio
from .progress import Progress
from .results import Table
from .settings import GpuSettings


def measure_official(components, model, arch, settings: GpuSettings, progress: Progress) -> dict[str, Any]:
    from worldstep.engine.config import RolloutKnobs

    from .official import OfficialRecipe, pipeline_from_components

    steps, height, width = settings.official_steps, model.spec.height, model.spec.width
    chunks = action_chunks(settings.windows + 1, arch)
    try:
        recipe = OfficialRecipe(pipeline_from_components(components), image=first_frame(height, width),
                                prompt=PROMPT, chunk_size=arch.chunk_size, num_steps=steps)
    except ValueError as err:  # a frame size the pipeline would pad: no equal-terms comparison
        return {"skipped": True, "reason": str(err)}
    progress(f"official recipe, {steps} steps: 1 warm-up + {settings.windows} chunks")
    official, encode, decode, sync = [], [], [], device_sync(model.device)
    try:
        for i, actions in enumerate(chunks):
            watch = SyncedStopwatch(sync)
            _, phases = recipe.step(actions)  # phases: name -> (wall, CPU) seconds of this chunk
            if i > 0:
                official.append(watch.elapsed()[0])
                encode.append(phases["encode"][0])
                decode.append(phases["decode"][0])
    finally:
        recipe.clock.remove(components.vae)
    progress(f"worldstep, {steps} steps: 1 warm-up + {settings.windows} windows")
    knobs = RolloutKnobs(chunk_size=arch.chunk_size, num_steps=steps, context_frames=8)
    session = open_sessions(model, arch, knobs, 1)[0]
    worldstep = []
    try:
        for i, actions in enumerate(chunks):
            watch = SyncedStopwatch(sync)
            model.step([session], [actions])[0]
            if i > 0:
                worldstep.append(watch.elapsed()[0])
    finally:
        model.close(session)
    return {
        "skipped": False, "num_steps": steps, "chunk_size": arch.chunk_size,
        "official_ms_per_step": 1e3 * median(official), "official_encode_ms": 1e3 * median(encode),
        "official_decode_ms": 1e3 * median(decode), "worldstep_ms_per_step": 1e3 * median(worldstep),
        "speedup": ratio(median(official), median(worldstep)),
    }


def official_table(f: dict[str, Any]) -> Table:
    o = f["official"]
    if o["skipped"]:
        return Table(title="official diffusers recipe", columns=["skipped"], rows=[[o["reason"]]])
    table = Table(
        title=f"env step vs the official diffusers recipe, {f['arch']} at {f['height']}x{f['width']}, "
              f"{o['num_steps']} steps, no CFG",
        columns=["alternative", "ms / env step", "of which encode", "of which decode", "worldstep speedup"],
        note="Same modules, GPU, frame, prompt and actions; the recipe re-encodes the last frame and denoises and "
             "decodes the whole clip every chunk.",
    )
    table.add("official recipe", o["official_ms_per_step"], o["official_encode_ms"], o["official_decode_ms"], None)
    table.add("worldstep", o["worldstep_ms_per_step"], None, None, o["speedup"])
    return table
