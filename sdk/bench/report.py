"""Markdown from `worldstep bench ... --json` files: the README's performance table and the full tables.

    python -m worldstep.bench.report runs/bench/*.json > table.md
    python -m worldstep.bench.report --headline runs/bench/*.json     # the README table only
    python -m worldstep.bench.report docs/bench/*.json --update README.md --update docs/performance.md

`--update` rewrites the generated blocks of a file in place (between the `bench-headline` or `bench-tables`
markers); tests/test_bench.py checks that the repository's blocks match `docs/bench/`.

`headline_table(docs)` and `render_markdown(docs)` take the loaded JSON dicts, for other scripts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..flags import flag, parse_flags
from .machine import machine_line
from .results import Table, format_cell, render_table

Doc = dict[str, Any]


def _x(value: float | None) -> str:
    return f"{format_cell(value)}x" if value is not None else "–"


def _rollout_rows(doc: Doc, table: Table) -> None:
    r = doc["results"]
    for arch, f in r.get("steps", {}).items():
        ms = f["ms_per_step"]
        table.add(f"env step, {arch} {f['height']}x{f['width']}, {f['chunk_size']} actions: diffusers recipe as "
                  "shipped / worldstep kv (what a recipe user gains; in CPU time)",
                  f"{_x(f['ratio_official_over_kv'])} ({_x(f.get('cpu_ratio_official_over_kv'))})", ">= 3x")
        table.add(f"env step, {arch}: recipe with worldstep's decoder kernels / worldstep kv (the engine alone, "
                  "equal kernels; in CPU time)",
                  f"{_x(f['ratio_official_kernels_over_kv'])} ({_x(f.get('cpu_ratio_official_kernels_over_kv'))})", "–")
        table.add(f"env step, {arch}: ms, worldstep kv / recipe with its kernels / recipe as shipped",
                  " / ".join(format_cell(ms[k]) for k in ("kv", "official_kernels", "official")), "–")
    scan = r.get("scan")
    if scan:
        n, s = scan["windows"], scan["span"]
        table.add(f"window time, windows {n - s + 1}-{n} / 1-{s} ({scan['arch']}, interleaved)",
                  _x(scan["late_over_early_interleaved"]), "<= 1.1x")
        table.add(f"KV pages in use, window {s} / {n}", f"{scan['pages_at_span']} / {scan['pages_last']}", "flat")
    pipe = r.get("pipelined")
    if pipe:
        table.add(f"open-loop rollout speed, pipelined / sequential ({pipe['arch']}, {pipe['windows']} windows)",
                  f"{_x(pipe['speedup'])}, frames bit-equal: {format_cell(pipe['frames_equal'])}", "–")


def _vector_rows(doc: Doc, table: Table) -> None:
    r = doc["results"]
    row = max(r.get("by_n", []), key=lambda row: row["n"], default=None)
    if row is None:
        return
    target = r.get("target_speedup_at_8")
    target = f">= {target}x at N=8" if target else "–"
    modes = row.get("speedup_by_mode")
    if modes is None:  # a file from before the two decode modes
        table.add(f"aggregate steps/s, N={row['n']} batched / one by one ({r['arch']}; in CPU time)",
                  f"{_x(row['speedup'])} ({_x(row.get('cpu_speedup'))})", target)
        return
    cpu = row["cpu_speedup_by_mode"]
    table.add(f"aggregate steps/s, N={row['n']} batched / one by one ({r['arch']}), per-stream / stacked decode "
              "(in CPU time)", f"{_x(modes['per_stream'])} / {_x(modes['stacked'])} ({_x(cpu['per_stream'])} / "
              f"{_x(cpu['stacked'])})", target)
    overhead = row["overhead_fraction"][f"batched_{row['best_mode']}"]
    table.add(f"Python overhead of a batched round, N={row['n']} ({r['arch']}, {row['best_mode'].replace('_', '-')} "
              "decode)", f"{100 * overhead:.1f}%", "<= 10%")


def _soak_rows(doc: Doc, table: Table) -> None:
    f = doc["results"]
    table.add(f"soak {f['windows']} windows: KV pages after context full", f"{f['pages_min_after_full']}.."
              f"{f['pages_max_after_full']}", "flat")
    block = f.get("rss_block_windows", 1)
    table.add(f"soak: RSS growth, median of the last {block} windows / of {block} from window "
              f"{f['rss_from_window']}", f"{f['rss_growth_pct']:.2f}%", "< 5%")


def _decode_rows(doc: Doc, table: Table) -> None:
    context = doc["settings"]["context_latents"]
    for row in doc["results"]["rows"]:
        w, clips = row["latents_per_window"], row["clip_latents"]
        table.add(f"decode, {w} latents/window: stateless ({context}-latent context) / warm (in CPU time)",
                  f"{_x(row['stateless_over_warm'])} ({_x(row['cpu_stateless_over_warm'])})", "–")
        table.add(f"decode, {w} latents/window: whole-clip re-decode ({clips[0]}..{clips[-1]} latents) / warm "
                  "(in CPU time)", f"{_x(row['whole_clip_over_warm'])} ({_x(row['cpu_whole_clip_over_warm'])})", "–")


def _gpu_rows(doc: Doc, table: Table) -> None:
    f = doc["results"]
    if f.get("skipped"):
        table.add("bench gpu", "not run (no CUDA)", "–")
        return
    for run in f["runs"]:
        cfg = "CFG" if run["cfg"] else "no CFG"
        mfu = f", MFU {100 * run['mfu']:.0f}%" if run.get("mfu") is not None else ""
        table.add(f"{f['arch']} {f['height']}p on {f['device']}, {run['num_steps']} steps, {cfg}: real-time factor",
                  f"{format_cell(run['real_time_factor'])}{mfu}", "–")


def _view_rows(doc: Doc, table: Table) -> None:
    f, settings = doc["results"], doc["settings"]
    table.add(f"live view: RerunLogger's work per step / the step ({settings['env']}, {settings['image_format']}; "
              "in CPU time)",
              f"{f['overhead_pct']:.1f}% ({f['overhead_cpu_pct']:.1f}%)", "<= 5%")


_HEADLINES: dict[str, Callable[[Doc, Table], None]] = {
    "rollout": _rollout_rows, "vector": _vector_rows, "soak": _soak_rows, "decode": _decode_rows, "gpu": _gpu_rows,
    "view": _view_rows,
}


ORDER = ["rollout", "decode", "vector", "soak", "view", "profile", "gpu"]  # the order documents are shown in
HEADLINE = ("<!-- bench-headline:begin (python -m worldstep.bench.report docs/bench/*.json --update README.md) -->",
            "<!-- bench-headline:end -->")
TABLES = ("<!-- bench-tables:begin (python -m worldstep.bench.report docs/bench/*.json --update "
          "docs/performance.md) -->", "<!-- bench-tables:end -->")


MAX_HEADLINE_LOAD = 1.5  # a 1-minute load above this at a run's start: the box was busy, and the figure is not one


def check_headline_loads(docs: Iterable[Doc]) -> None:
    """Refuse a headline from a run that started on a busy box (or did not record its load), naming each."""
    busy = []
    for doc in docs:
        load = (doc.get("machine", {}).get("load_average_start") or [None])[0]
        if load is None or load > MAX_HEADLINE_LOAD:
            busy.append(f"bench {doc.get('bench', '?')} at load {'(not recorded)' if load is None else f'{load:g}'}")
    if busy:
        raise ValueError(f"a headline is taken alone on an idle box (1-minute load at the start <= "
                         f"{MAX_HEADLINE_LOAD:g}); run again: {', '.join(busy)}")


def _ordered(docs: Iterable[Doc]) -> list[Doc]:
    return sorted(docs, key=lambda d: ORDER.index(d["bench"]) if d.get("bench") in ORDER else len(ORDER))


def headline_table(docs: Iterable[Doc]) -> Table:
    """One row per headline figure of every bench document given (the README table)."""
    table = Table("worldstep bench: headline figures", ["figure", "measured", "target"])
    for doc in _ordered(docs):
        add = _HEADLINES.get(doc.get("bench", ""))
        if add is not None:
            add(doc, table)
    return table


def render_markdown(docs: list[Doc], headline: bool = True, full: bool = True) -> str:
    parts = []
    if headline:
        check_headline_loads(docs)
        parts.append(render_table(headline_table(docs)))
        machines = sorted({machine_line(d["machine"], load=False) for d in docs})
        loads = [d["machine"]["load_average_start"][0] for d in docs if d["machine"].get("load_average_start")]
        load = f" 1-minute load average at the start of the runs: {min(loads):g} to {max(loads):g}." if loads else ""
        parts.append("Measured on: " + "; ".join(machines) + "." + load)
    if full:
        for doc in _ordered(docs):
            parts.append(f"### `worldstep bench {doc['bench']}`\n\n{machine_line(doc['machine'])}")
            parts += [render_table(t) for t in doc["tables"]]
            parts += [f"Note: {n}" for n in doc.get("notes", [])]
    return "\n\n".join(parts) + "\n"


def load_docs(paths: Iterable[str | Path]) -> list[Doc]:
    return [json.loads(Path(p).read_text()) for p in paths]


def generated_blocks(docs: list[Doc]) -> dict[tuple[str, str], str]:
    """(begin, end) marker -> the markdown that belongs between them."""
    return {HEADLINE: render_markdown(docs, full=False), TABLES: render_markdown(docs, headline=False)}


def update(path: str | Path, docs: list[Doc]) -> bool:
    """Rewrite every generated block of `path` in place; True when the file changed."""
    path = Path(path)
    text = new = path.read_text()
    found = False
    for (begin, end), body in generated_blocks(docs).items():
        if begin in new and end in new:
            head, rest = new.split(begin, 1)
            new = f"{head}{begin}\n{body}{end}{rest.split(end, 1)[1]}"
            found = True
    if not found:
        raise ValueError(f"{path} has no generated block; allowed: a file with the markers {HEADLINE[0]!r} or "
                         f"{TABLES[0]!r}, each followed by its end marker")
    path.write_text(new)
    return new != text


@dataclass
class ReportArgs:
    json: list[str] = flag("files written by worldstep bench ... --json", positional=True)
    headline: bool = flag("only the headline table", default=False)
    update: list[str] = flag("rewrite FILE's generated blocks in place instead of printing (repeatable)",
                             default_factory=list, repeat=True, metavar="FILE")


def main(argv: list[str] | None = None) -> int:
    args = parse_flags(ReportArgs, argv, prog="python -m worldstep.bench.report", description=__doc__.splitlines()[0])
    docs = load_docs(args.json)
    try:
        if args.update:
            for path in args.update:
                print(f"{path}: {'updated' if update(path, docs) else 'already current'}")
            return 0
        sys.stdout.write(render_markdown(docs, headline=True, full=not args.headline))
    except ValueError as err:  # a busy box's headline: nothing was written
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
