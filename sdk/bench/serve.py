"""`worldstep bench serve`: what serving costs, side by side in one run on one loaded model.

1. Aggregate env steps/s of `clients` client processes stepping through `worldstep serve` (in this process, on
   loopback), against the same number of local envs stepped one by one and against the local
   `WorldModelVectorEnv` with N = `clients`. The blocks run in mirrored order (A B C C B A), `repeats` times,
   so a drift of the machine's load hits every alternative alike and a burst of a shared box's neighbours falls
   on one block of several; each figure is `clients` over the median round time.
2. Per-step overhead: one remote client against one local env, interleaved step by step.
Each ratio carries a 95% bootstrap interval over its rounds (the mirrored blocks pair round i of every alternative;
the interleaved steps pair themselves), and a target counts as met only when the whole interval meets it.
3. Server pages and resident memory over `cycles` connect/reset/step/disconnect cycles.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..fidelity.stats import Estimate, bootstrap
from ..flags import flag, positive_int
from .machine import describe_machine
from .measure import interleave, median, ratio, rss_bytes
from .progress import Progress
from .results import BenchResult, Table

TARGET_SERVER_VS_VECTOR = 0.9
TARGET_OVERHEAD = 1.05


@dataclass
class ServeSettings:
    config: str = flag("served model: a config name (pusher, tiny) or checkpoint folder", default="pusher")
    clients: int = flag("client processes (and local envs, and the vector env's N)", default=8, type=positive_int)
    rounds: int = flag("measured steps per client per block", default=8, type=positive_int)
    repeats: int = flag("mirrored block sequences (A B C C B A), one after another", default=3, type=positive_int)
    warmup: int = flag("steps per client run first in each block and discarded", default=1)
    overhead_rounds: int = flag("measured steps of the one-client overhead comparison", default=64, type=positive_int)
    cycles: int = flag("connect/reset/step/disconnect cycles of the memory check", default=1000, type=positive_int)
    max_wait_ms: float = flag("the server's batching window (a loaded 2-core box schedules 8 client processes "
                               "tens of ms apart)", default=100.0)
    num_steps: int | None = flag("denoise steps per window (default: the config's)", default=None)
    cache_dir: str | None = flag("checkpoint cache (default $WORLDSTEP_CACHE)", default=None)


def actions(shape: tuple[int, ...], k: int, seed: int) -> np.ndarray:
    """The k-th action chunk of client `seed` (the same for the local alternatives)."""
    return (0.8 * np.sin(k + seed + np.linspace(0, 3, int(np.prod(shape))))).reshape(shape).astype(np.float32)


def client_main(url: str, seed: int, steps: int, go: str, out: str) -> None:
    """One client process: reset, say ready, wait for `go`, step, write each step's end time and the process CPU
    seconds each step took to `out`."""
    from worldstep.serve import RemoteWorldModelEnv

    env = RemoteWorldModelEnv(url, max_windows=steps + 1)
    env.reset(seed=seed)
    Path(out + ".ready").touch()
    while not Path(go).exists():
        time.sleep(0.005)
    ends, cpu = [], []
    for k in range(steps):
        started = time.process_time()
        env.step(actions(env.action_space.shape, k, seed))
        ends.append(time.time())
        cpu.append(time.process_time() - started)
    env.close()
    Path(out).write_text(json.dumps({"ends": ends, "cpu_s": cpu}))


def run_serve(settings: ServeSettings, progress: Progress) -> BenchResult:
    import os

    import worldstep
    from worldstep.serve.server import WorldModelServer

    if settings.cache_dir is not None:
        os.environ["WORLDSTEP_CACHE"] = settings.cache_dir
    overrides = {} if settings.num_steps is None else {"num_steps": settings.num_steps}
    world = worldstep.load(settings.config, device="cpu", **overrides)
    result = BenchResult("serve", describe_machine(), settings=vars(settings).copy())
    server = WorldModelServer(world, max_batch=settings.clients, max_wait_ms=settings.max_wait_ms,
                              max_sessions=max(64, settings.clients + 2)).start()
    try:
        rounds, cpu, engine_s = _aggregate(world, server, settings, progress)
        sizes = list(server.loop.batch_sizes)  # the server blocks' batches (the checks below step alone)
        overhead = _overhead(world, server, settings, progress)
        memory = _cycles(server, settings, progress)
    finally:
        server.drain()
    n = settings.clients
    steps_per_s = {name: ratio(n, median(times)) for name, times in rounds.items()}
    server_vs_vector = _ratio_estimate(rounds["vector_env"], rounds["server"])
    result.results = {
        "config": settings.config, "clients": n, "steps_per_s": steps_per_s,
        "rounds_per_alternative": len(rounds["server"]),
        "server_vs_vector": server_vs_vector.value,
        "server_vs_vector_ci95": [server_vs_vector.low, server_vs_vector.high],
        "server_vs_separate": ratio(steps_per_s["server"], steps_per_s["separate"]),
        "server_engine_call_s": median(engine_s),
        "batch_sizes": {str(k): sizes.count(k) for k in sorted(set(sizes))},
        "round_s": {name: median(times) for name, times in rounds.items()},
        "cpu_s_per_round": cpu, "cores": os.cpu_count(),
        "overhead": overhead, "cycles": memory,
        "targets": {"server_vs_vector": TARGET_SERVER_VS_VECTOR, "overhead": TARGET_OVERHEAD},
    }
    result.tables += _tables(settings, result.results)
    _notes(result)
    return result


# --- 1. aggregate steps/s ----------------------------------------------------------------------------


def _ratio_estimate(numerator: list[float], denominator: list[float]) -> Estimate:
    """median(numerator) / median(denominator) with its bootstrap interval over paired rounds (round i of each)."""
    a, b = np.asarray(numerator), np.asarray(denominator)
    if len(a) != len(b):
        raise ValueError(f"paired rounds differ in number: {len(a)} and {len(b)}")
    return bootstrap(lambda idx: ratio(float(np.median(a[idx])), float(np.median(b[idx]))), len(a))


def _aggregate(world, server, settings: ServeSettings,
               progress: Progress) -> tuple[dict[str, list[float]], dict[str, dict[str, float]], list[float]]:
    """Round times per alternative, the CPU seconds a round took in this process (the envs, or the server's
    threads) and, for the server, in its client processes, and the wall time of each measured round's engine call
    in the server: where a round's time goes."""
    blocks = {"vector_env": _vector_block, "server": _server_block, "separate": _separate_block}
    order = [*blocks, *reversed(blocks)] * settings.repeats
    times: dict[str, list[float]] = {name: [] for name in blocks}
    cpu: dict[str, dict[str, list[float]]] = {name: {} for name in blocks}
    engine_s: list[float] = []
    for i, name in enumerate(order):
        seen = server.loop.batches
        progress(f"block {i + 1}/{len(order)}: {name}, {settings.clients} envs, {settings.warmup} + "
                 f"{settings.rounds} steps")
        block_times, bench_cpu, clients_cpu = blocks[name](world, server, settings)
        times[name] += block_times
        cpu[name].setdefault("bench_process", []).append(bench_cpu)
        if clients_cpu is not None:
            cpu[name].setdefault("clients", []).append(clients_cpu)
        if name == "server":  # the block's engine calls, one per round once all clients batch (warm-up dropped)
            recent = list(server.loop.batch_seconds)  # the loop's bounded history: the block's batches are its newest
            engine_s += recent[max(0, len(recent) - (server.loop.batches - seen)):][settings.warmup:]
    cpu_s = {name: {k: median(v) for k, v in c.items()} for name, c in cpu.items()}
    return times, cpu_s, engine_s


def _vector_block(world, server, s: ServeSettings) -> list[float]:
    from worldstep.world import make_vec_env

    vec = make_vec_env(world, s.clients, max_windows=s.warmup + s.rounds + 1)
    try:
        vec.reset(seed=list(range(s.clients)))
        shape = vec.single_action_space.shape
        out, cpu = [], []
        for k in range(s.warmup + s.rounds):
            batch = np.stack([actions(shape, k, seed) for seed in range(s.clients)])
            start, started_cpu = time.perf_counter(), time.process_time()
            vec.step(batch)
            out.append(time.perf_counter() - start)
            cpu.append(time.process_time() - started_cpu)
        return out[s.warmup:], median(cpu[s.warmup:]), None
    finally:
        vec.close()


def _separate_block(world, server, s: ServeSettings) -> list[float]:
    from worldstep import make_env

    envs = [make_env(world, max_windows=s.warmup + s.rounds + 1) for _ in range(s.clients)]
    try:
        for seed, env in enumerate(envs):
            env.reset(seed=seed)
        out, cpu = [], []
        for k in range(s.warmup + s.rounds):
            start, started_cpu = time.perf_counter(), time.process_time()
            for seed, env in enumerate(envs):
                env.step(actions(env.action_space.shape, k, seed))
            out.append(time.perf_counter() - start)
            cpu.append(time.process_time() - started_cpu)
        return out[s.warmup:], median(cpu[s.warmup:]), None
    finally:
        for env in envs:
            env.close()


def _server_block(world, server, s: ServeSettings) -> tuple[list[float], float, float]:
    """Round times of `clients` processes (round r ends when the last client's r-th step has come back), the bench
    process's CPU seconds per round (the server's threads, over all rounds) and all clients' together in a
    measured round (median over rounds)."""
    steps = s.warmup + s.rounds
    with tempfile.TemporaryDirectory() as folder:
        go, outs = Path(folder) / "go", [Path(folder) / f"client{i}.json" for i in range(s.clients)]
        code = "import sys; from worldstep.bench.serve import client_main as m; m(*sys.argv[1:2], " \
               "int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6])"
        procs = [subprocess.Popen([sys.executable, "-c", code, server.url, str(i), str(steps), str(go), str(out)])
                 for i, out in enumerate(outs)]
        try:
            deadline = time.monotonic() + 600
            while not all(Path(f"{o}.ready").exists() for o in outs):
                if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                    raise RuntimeError("bench serve: a client process failed to start")
                time.sleep(0.01)
            start, started_cpu = time.time(), time.process_time()
            go.touch()
            for proc in procs:
                if proc.wait(timeout=600) != 0:
                    raise RuntimeError(f"bench serve: a client process exited with {proc.returncode}")
            bench_cpu = (time.process_time() - started_cpu) / steps
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        records = [json.loads(o.read_text()) for o in outs]
    ends = np.array([r["ends"] for r in records])  # [clients, steps]
    clients_cpu = np.array([r["cpu_s"] for r in records]).sum(axis=0)[s.warmup:]  # [rounds]
    round_ends = np.concatenate([[start], ends.max(axis=0)])
    return list(np.diff(round_ends)[s.warmup:]), bench_cpu, float(np.median(clients_cpu))


# --- 2. one client's overhead ------------------------------------------------------------------------


def _overhead(world, server, s: ServeSettings, progress: Progress) -> dict[str, float]:
    from worldstep import make_env
    from worldstep.serve import RemoteWorldModelEnv

    progress(f"overhead: one remote client vs one local env, {s.overhead_rounds} steps each, interleaved")
    windows = s.overhead_rounds + 2
    remote, local = RemoteWorldModelEnv(server.url, max_windows=windows), make_env(world, max_windows=windows)
    try:
        remote.reset(seed=0)
        local.reset(seed=0)
        taken = {"remote": 0, "local": 0}

        def stepper(name, env):
            def step() -> None:
                env.step(actions(env.action_space.shape, taken[name], 0))
                taken[name] += 1
            return step

        samples = interleave({"remote": stepper("remote", remote), "local": stepper("local", local)},
                             rounds=s.overhead_rounds, warmup=1)
    finally:
        remote.close()
        local.close()
    estimate = _ratio_estimate(samples["remote"].seconds, samples["local"].seconds)
    return {"remote_ms": samples["remote"].median_ms, "local_ms": samples["local"].median_ms,
            "ratio": estimate.value, "ratio_ci95": [estimate.low, estimate.high]}


# --- 3. pages and memory over many cycles ------------------------------------------------------------


def _cycles(server, s: ServeSettings, progress: Progress) -> dict[str, Any]:
    from worldstep.serve import RemoteWorldModelEnv

    rss, pages = [], []
    for i in range(s.cycles):
        env = RemoteWorldModelEnv(server.url, max_windows=2)
        env.reset(seed=i)
        env.step(np.zeros(env.action_space.shape, np.float32))
        env.close()
        if (i + 1) % max(1, s.cycles // 10) == 0:
            rss.append(rss_bytes() / 2**20)
            pages.append(server.pages_in_use())
            progress(f"cycles: {i + 1}/{s.cycles}, pages in use {pages[-1]}, RSS {rss[-1]:.0f} MiB")
    growth = 100 * (ratio(rss[-1], rss[len(rss) // 2]) - 1) if len(rss) > 1 else 0.0
    return {"cycles": s.cycles, "pages_in_use": pages, "rss_mib": rss, "pages_flat": all(p == 0 for p in pages),
            "rss_growth_pct_second_half": growth}


# --- tables --------------------------------------------------------------------------------------------


def _tables(s: ServeSettings, r: dict[str, Any]) -> list[Table]:
    agg = Table(title=f"Aggregate env steps/s, {s.config}, {s.clients} envs", columns=[
        f"{s.clients} local envs one by one", f"local vector env N={s.clients}", f"{s.clients} clients via server",
        "server / vector env [95% interval]", "server / one by one"],
        note=(f"Medians of {r['rounds_per_alternative']} rounds per alternative in mirrored blocks; the server runs "
              f"in the bench process on loopback (--max-wait-ms {s.max_wait_ms:g}), each client is its own process. "
              "The interval is a bootstrap over the paired rounds."))
    sps = r["steps_per_s"]
    agg.add(sps["separate"], sps["vector_env"], sps["server"], _with_interval(r["server_vs_vector"],
            r["server_vs_vector_ci95"]), r["server_vs_separate"])
    cpu = r["cpu_s_per_round"]
    where = Table(title=f"Where a round goes, {s.config}, {s.clients} envs: CPU seconds per round (median)", columns=[
        "alternative", "round wall s", "bench process CPU s", "client processes CPU s", "CPU / (wall x cores)"],
        note=f"{r['cores']} cores. The bench process runs the envs, or the server's threads; each client is its "
             "own process (its decode of the frames, msgpack, websockets). A share near 1 means the round waits "
             f"for CPU, not for the model. The server's engine call takes {r['server_engine_call_s']:.3f} s of its "
             "round (median); the rest is serving: replies out, the clients' next steps in, the batch filling.")
    for name in ("vector_env", "server", "separate"):
        total = cpu[name]["bench_process"] + cpu[name].get("clients", 0.0)
        where.add(name, r["round_s"][name], cpu[name]["bench_process"], cpu[name].get("clients"),
                  total / (r["round_s"][name] * r["cores"]))
    o = r["overhead"]
    over = Table(title=f"One client: ms per step, {s.config}",
                 columns=["local env", "remote env", "remote / local [95% interval]"],
                 note=f"Medians of {s.overhead_rounds} interleaved steps each; the interval is a bootstrap over them.")
    over.add(o["local_ms"], o["remote_ms"], _with_interval(o["ratio"], o["ratio_ci95"]))
    c = r["cycles"]
    mem = Table(title=f"Server after {c['cycles']} connect/reset/step/disconnect cycles",
                columns=["pages in use (every tenth)", "RSS first MiB", "RSS last MiB", "RSS growth, 2nd half %"])
    mem.add(" ".join(map(str, c["pages_in_use"])), c["rss_mib"][0] if c["rss_mib"] else None,
            c["rss_mib"][-1] if c["rss_mib"] else None, c["rss_growth_pct_second_half"])
    return [agg, where, over, mem]


def _with_interval(value: float, ci95: list[float]) -> str:
    return f"{value:.2f} [{ci95[0]:.2f}, {ci95[1]:.2f}]"


def _notes(result: BenchResult) -> None:
    """A target is met only when its whole interval meets it; anything else is named."""
    r = result.results
    low = r["server_vs_vector_ci95"][0]
    if not low >= TARGET_SERVER_VS_VECTOR:  # NaN (too few rounds) is not met either
        result.notes.append(f"server / vector env {_with_interval(r['server_vs_vector'], r['server_vs_vector_ci95'])} "
                            f"does not meet the >= {TARGET_SERVER_VS_VECTOR} target on its interval (batch sizes "
                            f"seen: {r['batch_sizes']})")
    o = r["overhead"]
    if not o["ratio_ci95"][1] <= TARGET_OVERHEAD:
        result.notes.append(f"one remote client costs {_with_interval(o['ratio'], o['ratio_ci95'])}x a local env "
                            f"per step: not within the <= {TARGET_OVERHEAD} target on its interval")
