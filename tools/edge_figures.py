"""What a Cosmos3-Edge run needs (docs/usage.md), generated from the committed GPU run so the text never drifts.

A doc generator, kept out of the installed package (`tools/` is not in pyproject's packages):

    python tools/edge_figures.py                 # print the block
    python tools/edge_figures.py docs/usage.md   # rewrite the block between the markers in place
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "docs/bench/gpu/h200-141gb/bench_gpu_headline.json"
BEGIN = "<!-- edge-figures:begin (python tools/edge_figures.py docs/usage.md) -->"
END = "<!-- edge-figures:end -->"
GIB = 2**30


def render(path: Path = ROOT / SOURCE) -> str:
    """Memory per session count and speed at 4 and 30 denoise steps, with the device and settings they came from."""
    data = json.loads(path.read_text())
    r = data["results"]
    runs = {(run["num_steps"], run["cfg"]): run["ms_per_window"] for run in r["runs"]}
    base = r["sessions"][0]["weights_and_pool_bytes"]
    pages = int((base - 2 * r["transformer_params"] - 4 * r["vae_params"]) / r["sessions"][0]["page_bytes"])
    memory = ", ".join(f"{s['sessions']} session{'s' if s['sessions'] > 1 else ''} "
                       f"{s['peak_device_bytes'] / GIB:.1f} GiB" for s in r["sessions"])
    steps = ", ".join(f"{n} steps {runs[(n, False)]:,.0f} ms ({runs[(n, True)]:,.0f} with CFG)"
                      for n in sorted({n for n, _ in runs}))
    return (f"Measured on one {r['device_name']} ({SOURCE}; the transformer in {r['dtype']}, the VAE in "
            f"{r['vae_dtype']}, {r['attention_backend']}, {r['height']}x{r['width']}, {r['chunk_size']} actions a "
            f"window, full-size random weights): peak device memory {memory} ("
            f"{base / GIB:.1f} GiB of it the weights and a {pages}-page KV pool); "
            f"one window takes {steps}. "
            "The shipped config runs 30 steps. `worldstep info --config cosmos3_edge --device cuda` plans the "
            "memory of other settings on any machine.")


def update(doc: Path) -> None:
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{render()}\n{END}{tail}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        update(Path(sys.argv[1]))
    else:
        print(render())
