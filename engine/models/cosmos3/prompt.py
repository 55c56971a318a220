"""The text side of a forward-dynamics clip: the structured JSON caption and its chat-template tokens.

Cosmos3's action modes were trained on a JSON caption (framing, action description, duration, fps,
resolution, aspect ratio), wrapped in the chat template, followed by `eos` and `<|vision_start|>`.
The uncond (CFG) stream uses the raw negative prompt in the same template.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ...kv import StreamLabel

VIEWPOINT_FRAMING = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": "This video is captured from a third-person perspective looking towards the agent "
                         "from the front.",
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
}
_ASPECT_RATIOS = ("1,1", "4,3", "3,4", "16,9", "9,16")


@dataclass(frozen=True)
class PromptTokens:
    """Token ids of the two CFG streams."""

    cond: list[int]
    uncond: list[int]


def action_caption(description: str, *, view_point: str, num_frames: int, fps: float, height: int, width: int) -> str:
    """The JSON caption the action model was trained on (same fields and order as the diffusers pipeline)."""
    seconds = num_frames / fps if fps > 0 else 0.0
    whole = int(seconds) if seconds >= 0 and math.isfinite(seconds) else 0
    end = round(seconds) if seconds >= 0 and math.isfinite(seconds) else 0
    minutes, secs = divmod(end, 60)
    text = description.strip()
    if text and not text.endswith((".", "!", "?")):
        text += "."
    caption: dict = {}
    if view_point in VIEWPOINT_FRAMING:
        caption["cinematography"] = {"framing": VIEWPOINT_FRAMING[view_point]}
    ratio = width / height if height > 0 else 1.0
    caption["actions"] = [{"time": f"0:00-{minutes}:{secs:02d}", "description": text}]
    caption["duration"] = f"{whole}s"
    caption["fps"] = float(fps)
    caption["resolution"] = {"H": int(height), "W": int(width)}
    caption["aspect_ratio"] = min(_ASPECT_RATIOS,
                                  key=lambda r: abs(int(r[0 : r.index(",")]) / int(r[r.index(",") + 1 :]) - ratio))
    return json.dumps(caption)


def _chat_ids(tokenizer, text: str, system_prompt: str | None) -> list[int]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": text})
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, add_vision_id=False, return_dict=True
    )
    return list(encoded["input_ids"])


def tokenize_action_prompt(
    tokenizer,
    prompt: str,
    negative_prompt: str,
    *,
    view_point: str,
    num_frames: int,
    fps: float,
    height: int,
    width: int,
    use_system_prompt: bool = False,
) -> PromptTokens:
    """Cond ids from the JSON caption, uncond ids from the raw negative prompt; both end in eos, vision_start."""
    system = "You are a helpful assistant who will generate videos from a give prompt." if use_system_prompt else None
    tail = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|vision_start|>")]
    caption = action_caption(prompt, view_point=view_point, num_frames=num_frames, fps=fps, height=height, width=width)
    return PromptTokens(
        cond=_chat_ids(tokenizer, caption, system) + tail,
        uncond=_chat_ids(tokenizer, negative_prompt, system) + tail,
    )


def session_prompt_ids(tokenizer, prompt: str, knobs, *, view_point: str, fps: float, size: tuple[int, int],
                       use_system_prompt: bool) -> dict[StreamLabel, list[int]]:
    """The token ids of each KV stream of a session: ``main``, and ``uncond`` under CFG."""
    tokens = tokenize_action_prompt(tokenizer, prompt, knobs.negative_prompt, view_point=view_point,
                                    num_frames=knobs.chunk_size + 1, fps=fps, height=size[0], width=size[1],
                                    use_system_prompt=use_system_prompt)
    labels = (StreamLabel.MAIN, StreamLabel.UNCOND) if knobs.uses_cfg else (StreamLabel.MAIN,)
    return {label: tokens.cond if label is StreamLabel.MAIN else tokens.uncond for label in labels}
