"""Checks on everything a user hands a session, run before any device work.

A bad `domain_id` must never reach the embedding lookup on a GPU (a device-side assert takes the
whole CUDA context with it), so ids, actions, images and prompts are checked on the host first.
"""

from __future__ import annotations

import numpy as np

MAX_PROMPT_CHARS = 20_000


def check_domain_id(domain_id, num_domains: int) -> int:
    if isinstance(domain_id, (bool, np.bool_)) or not isinstance(domain_id, (int, np.integer)):
        raise ValueError(
            f"domain_id={domain_id!r} ({type(domain_id).__name__}) is invalid; allowed: an int in [0, {num_domains})"
        )
    if not 0 <= int(domain_id) < num_domains:
        raise ValueError(f"domain_id={int(domain_id)} is out of range; allowed: an int in [0, {num_domains})")
    return int(domain_id)


def check_prompt(prompt, field: str = "prompt", allow_empty: bool = False) -> str:
    allowed = f"{'a' if allow_empty else 'a non-empty'} string of at most {MAX_PROMPT_CHARS} characters"
    if not isinstance(prompt, str) or (not allow_empty and not prompt.strip()):
        raise ValueError(f"{field}={prompt!r} is invalid; allowed: {allowed}")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"{field} of {len(prompt)} characters is invalid; allowed: {allowed}")
    return prompt


def check_actions(actions, chunk_size: int, action_dim: int) -> np.ndarray:
    """`(chunk_size, k)` finite floats with `1 <= k <= action_dim`; returns a float32 copy."""
    if isinstance(actions, (list, tuple)):
        actions = np.asarray(actions)
    if hasattr(actions, "detach"):  # torch tensor
        actions = actions.detach().cpu().numpy()
    if not isinstance(actions, np.ndarray):
        raise ValueError(f"actions of type {type(actions).__name__} are invalid; allowed: a float array (chunk, k)")
    if actions.dtype.kind not in "fiu" or actions.dtype == np.bool_:
        raise ValueError(f"actions dtype {actions.dtype} is invalid; allowed: a float array")
    if actions.ndim != 2 or actions.shape[0] != chunk_size or not 1 <= actions.shape[1] <= action_dim:
        raise ValueError(
            f"actions shape {tuple(actions.shape)} is invalid; allowed: ({chunk_size}, k) with 1 <= k <= {action_dim}"
        )
    if not np.all(np.isfinite(actions)):
        raise ValueError("actions contain NaN or inf; allowed: finite values")
    return actions.astype(np.float32, copy=True)


def check_image(image, min_size: int = 16) -> np.ndarray:
    """HxWx3 uint8, or float in [0, 1]."""
    if not isinstance(image, np.ndarray):
        raise ValueError(f"image of type {type(image).__name__} is invalid; allowed: a numpy array HxWx3")
    if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < min_size:
        raise ValueError(
            f"image shape {tuple(image.shape)} is invalid; allowed: (H, W, 3) with H, W >= {min_size}"
        )
    if image.dtype == np.uint8:
        return image
    if image.dtype.kind != "f":
        raise ValueError(f"image dtype {image.dtype} is invalid; allowed: uint8, or float in [0, 1]")
    if not np.all(np.isfinite(image)) or image.min() < 0 or image.max() > 1:
        raise ValueError("image float values are invalid; allowed: finite values in [0, 1]")
    return image
