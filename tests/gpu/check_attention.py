"""GPU check: the flashinfer paged-attention backend against sdpa and an fp32 reference, at Edge geometry.

    python tests/gpu/check_attention.py [--out DIR]        # exit 0: all agree; 1: a difference, NaN/inf, no CUDA
    python tests/gpu/check_attention.py --device cpu --tiny  # dry run: sdpa vs the reference only

Cosmos3-Edge's cache: bf16, page size 128, GQA 16:8, head_dim 128, 28 layers, 390 tokens per latent frame
at 832x480 (a 26x15 patch grid) plus 4 action tokens, 16-action windows (4 latent frames, 1576 fresh
tokens; window 0 adds the clean frame, 1966). The rows are built through the cache's own calls:

| row            | committed context                                                     | fresh |
|----------------|-----------------------------------------------------------------------|-------|
| main           | 38 text tokens + 4 windows, older frames released past 8 latent frames | 1576  |
| uncond         | 14 text tokens + the same windows (the CFG stream)                     | 1576  |
| long_prompt    | 300 text tokens + 2 windows                                            | 1576  |
| fork           | `fork()` of main (shared pages), then a window of its own (tail COW)   | 1576  |
| text_only      | 14 text tokens (less than one page)                                    | 1966  |
| no_context     | nothing                                                                | 1966  |

(38 and 14 are the bench prompt's cond/uncond token counts with the embedded tokenizer; 300 stands for a
real tokenizer's JSON caption.) Three steps reuse one batch (plan reuse), then main commits a window,
releases pages past its horizon, and a new batch runs again. Every backend output is compared with an
fp32 softmax attention over the same K/V; flashinfer also with sdpa. Bound: max |x - ref| / max |ref|
<= 1.6e-2 (4 bf16 epsilons); any NaN or inf fails, in the reference too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from figures import Timer, parse_args, rel_diff, resolve_device, within, write
from worldstep.engine.attention import (
    AttentionBackendName,
    PagedAttentionBatch,
    flashinfer_problems,
    paged_attention,
    prime,
)
from worldstep.engine.kv import PagedKVCache, StreamKey, StreamLabel, check_invariants
from worldstep.engine.windowing import WindowSchedule

BOUND = 1.6e-2


@dataclass(frozen=True)
class Geometry:
    heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    layers: int
    tokens_per_frame: int
    latents_per_window: int
    actions_per_window: int
    context_frames: int
    texts: tuple[int, int, int]  # main, uncond, long prompt
    checked_layers: tuple[int, ...]
    num_pages: int

    @property
    def unit(self) -> int:  # a latent frame's vision tokens plus its 4 action tokens
        return self.tokens_per_frame + 4

    @property
    def window(self) -> int:  # fresh tokens of a steady window
        return self.latents_per_window * self.tokens_per_frame + self.actions_per_window

    @property
    def first_window(self) -> int:  # window 0 carries the clean conditioning frame
        return self.window + self.tokens_per_frame


EDGE = Geometry(heads=16, kv_heads=8, head_dim=128, page_size=128, layers=28, tokens_per_frame=15 * 26,
                latents_per_window=4, actions_per_window=16, context_frames=8, texts=(38, 14, 300),
                checked_layers=(0, 13, 27), num_pages=256)
TINY = Geometry(heads=4, kv_heads=2, head_dim=32, page_size=16, layers=2, tokens_per_frame=12,
                latents_per_window=2, actions_per_window=8, context_frames=3, texts=(7, 3, 40),
                checked_layers=(0, 1), num_pages=256)


class Rows:
    """The check's streams in one cache, grown through the cache's own append / retention / fork."""

    def __init__(self, geo: Geometry, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        self.geo, self.device, self.dtype = geo, device, dtype
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.cache = PagedKVCache(num_layers=geo.layers, num_pages=geo.num_pages, page_size=geo.page_size,
                                            num_kv_heads=geo.kv_heads, head_dim=geo.head_dim, dtype=dtype,
                                            device=device)
        self.windows: dict[str, int] = {}
        main, uncond, long_prompt = geo.texts
        for name, text, windows in (("main", main, 4), ("uncond", uncond, 4), ("long_prompt", long_prompt, 2),
                                    ("text_only", uncond, 0)):
            self._create(name, text)
            for _ in range(windows):
                self.commit(name)
        self.cache.fork(StreamKey("main", StreamLabel.MAIN), StreamKey("fork", StreamLabel.MAIN))
        self.windows["fork"] = self.windows["main"]
        self.commit("fork")
        self.cache.create_stream(StreamKey("no_context", StreamLabel.MAIN))
        self.windows["no_context"] = 0

    def _create(self, name: str, text: int) -> None:
        key = StreamKey(name, StreamLabel.MAIN)
        self.cache.create_stream(key)
        self.cache.append(key, *self._kv(text))
        self.cache.protect_prefix(key, text)
        self.windows[name] = 0

    def _kv(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.geo
        kv = torch.randn(2, g.layers, n, g.kv_heads, g.head_dim, generator=self.gen, device=self.device)
        return kv[0].to(self.dtype), kv[1].to(self.dtype)  # [layers, n, Hkv, D] each

    def fresh(self, name: str) -> int:
        return self.geo.first_window if self.windows[name] == 0 else self.geo.window

    def commit(self, name: str) -> None:
        """Append one window's K/V, then release what lies past the horizon (as the engine's commit does)."""
        key, g = StreamKey(name, StreamLabel.MAIN), self.geo
        self.cache.append(key, *self._kv(self.fresh(name)))
        self.windows[name] += 1
        schedule = WindowSchedule(None, g.latents_per_window, context_units=g.context_frames)
        text = self.cache.page_table(key).protected_prefix_tokens
        self.cache.apply_retention(key, schedule.retention(g.unit, text))

    def names(self) -> list[str]:
        return ["main", "uncond", "long_prompt", "fork", "text_only", "no_context"]

    def batch(self, backend: AttentionBackendName) -> PagedAttentionBatch:
        names = self.names()
        return PagedAttentionBatch(self.cache, [self.cache.page_table(StreamKey(n, StreamLabel.MAIN)) for n in names],
                                   [self.fresh(n) for n in names], backend)

    def describe(self) -> list[dict]:
        out = []
        for n in self.names():
            t = self.cache.page_table(StreamKey(n, StreamLabel.MAIN))
            out.append({"row": n, "committed": t.seq_len, "released": t.released_tokens, "pages": len(t.pages),
                        "fresh": self.fresh(n), "text": t.protected_prefix_tokens})
        return out


def reference(rows: Rows, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer: int) -> torch.Tensor:
    """fp32 softmax attention of each row's queries over [its committed K/V | its fresh K/V] (no kernels shared)."""
    g, out, start = rows.geo, torch.empty(q.shape, dtype=torch.float32, device=q.device), 0
    for name in rows.names():
        n = rows.fresh(name)
        k_ctx, v_ctx = rows.cache.gather(StreamKey(name, StreamLabel.MAIN), layer)  # [S, Hkv, D]
        k = torch.cat([k_ctx, k_new[start:start + n]]).float().repeat_interleave(g.heads // g.kv_heads, 1)
        v = torch.cat([v_ctx, v_new[start:start + n]]).float().repeat_interleave(g.heads // g.kv_heads, 1)
        scores = torch.einsum("qhd,khd->hqk", q[start:start + n].float(), k) / g.head_dim ** 0.5  # [H, n, S+n]
        out[start:start + n] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)  # [n, H, D]
        start += n
    return out


def run_phase(rows: Rows, backends: list[AttentionBackendName], steps: int, phase: str) -> list[dict]:
    """`steps` steps through one batch per backend; every checked layer compared with the reference."""
    g = rows.geo
    batches = {b: rows.batch(b) for b in backends}
    n = batches[backends[0]].num_tokens
    results = []
    for step in range(steps):
        q = torch.randn(n, g.heads, g.head_dim, generator=rows.gen, device=rows.device).to(rows.dtype)
        k_new, v_new = torch.randn(2, n, g.kv_heads, g.head_dim, generator=rows.gen, device=rows.device).to(rows.dtype)
        forwards = {b: prime(batch, g.heads) for b, batch in batches.items()}  # once per step, as a model's forward
        for layer in g.checked_layers:
            ref = reference(rows, q, k_new, v_new, layer)
            outs, seconds = {}, {}
            for b, forward in forwards.items():
                with Timer(rows.device) as timer:
                    outs[b] = paged_attention(q, k_new, v_new, forward, layer)
                seconds[b] = timer.seconds
            record = {"phase": phase, "step": step, "layer": layer, "reference_finite": bool(torch.isfinite(ref).all())}
            for b, o in outs.items():
                record[f"{b.value}_vs_reference"] = rel_diff(o, ref)
                record[f"{b.value}_ms"] = 1e3 * seconds[b]
            if AttentionBackendName.FLASHINFER in outs:
                record["flashinfer_vs_sdpa"] = rel_diff(outs[AttentionBackendName.FLASHINFER],
                                                        outs[AttentionBackendName.SDPA])
            record["ok"] = record["reference_finite"] and all(
                within(v, BOUND) for k, v in record.items() if k.endswith("_vs_reference") or k == "flashinfer_vs_sdpa")
            results.append(record)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    device = resolve_device(args)
    if device is None:
        write(args.out, "attention", {"ok": False, "reason": "CUDA is not available"})
        return 1
    geo = TINY if args.tiny else EDGE
    backends = [AttentionBackendName.SDPA]
    flashinfer_note = "ran"
    problems = flashinfer_problems(device, torch.bfloat16, geo.head_dim)
    if not problems:  # only where its kernels load; otherwise the figures say why (sdpa vs the reference)
        backends.append(AttentionBackendName.FLASHINFER)
    else:
        flashinfer_note = f"not run: {'; '.join(problems)}"
    rows = Rows(geo, device, torch.bfloat16)
    doc = {"dry_run": device.type != "cuda", "geometry": vars(geo), "bound": BOUND, "flashinfer": flashinfer_note,
           "rows_before": rows.describe()}
    doc["results"] = run_phase(rows, backends, steps=3, phase="steady")
    write(args.out, "attention", {**doc, "ok": False, "partial": True})
    rows.commit("main")  # a commit that releases pages; the tables change, so a new batch
    doc["rows_after"] = rows.describe()
    doc["results"] += run_phase(rows, backends, steps=1, phase="after_release")
    check_invariants(rows.cache)
    ok = all(r["ok"] for r in doc["results"])
    worst = {k: max(r[k] for r in doc["results"]) for k in doc["results"][0] if k.endswith("_vs_reference")
             or k == "flashinfer_vs_sdpa"}
    write(args.out, "attention", {**doc, "ok": ok, "worst": worst})
    for r in doc["results"]:
        figures = " ".join(f"{k}={v:.2e}" for k, v in r.items() if k.endswith("_vs_reference") or k.endswith("_sdpa"))
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['phase']} step {r['step']} layer {r['layer']:2d}: {figures}")
    print(f"attention: {'ok' if ok else 'FAILED'}; worst {worst} (bound {BOUND:g}); {flashinfer_note}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
