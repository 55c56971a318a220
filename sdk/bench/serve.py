"""`worldstep bench serve`: what serving costs, side by side in one run on one loaded model.

1. Aggregate env steps/s of `clients` client processes stepping through `worldstep serve` (in this process, on
   loopback), against the same number of local envs stepped one by one and against the local
   `WorldModelVectorEnv` with N = `clients`. The alternatives take turns ROUND BY ROUND in mirrored order
   (A B C, then C B A), over `episodes` episodes that every alternative resets together, so a drift of the
   machine's load or a burst of a shared box's neighbours hits all of them alike; each figure is `clients` over
   the median round time. The client processes live for the whole comparison and step together when told (one
   line on their stdin), so a server round runs from that word to the last client's reply, the word's trip
   included.
2. Per-step overhead: one remote client against one local env, interleaved step by step.
Each ratio carries a 95% bootstrap interval over its rounds (round i of each alternative are paired), and a target
counts as met only when the whole interval meets it.
3. Server pages and resident memory over `cycles` connect/reset/step/disconnect cycles.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..flags import flag, non_negative_int, positive_int
from .machine import describe_machine
from .measure import Stopwatch, interleave, median, ratio, ratio_estimate, rss_bytes
from .progress import Progress
from .results import BenchResult, Table

TARGET_SERVER_VS_VECTOR = 0.9
TARGET_OVERHEAD = 1.05
CLIENT_TIMEOUT_S = 600.0  # a client that answers nothing this long has failed
CLIENT_EXIT_WAIT_S = 30.0  # a client whose pipe closed is reaped within this


@dataclass
class ServeSettings:
    config: str = flag("served model: a config name (pusher, tiny) or checkpoint folder", default="pusher")
    clients: int = flag("client processes (and local envs, and the vector env's N)", default=8, type=positive_int)
    rounds: int = flag("measured steps per env in each episode", default=8, type=positive_int)
    episodes: int = flag("episodes every alternative runs, reset together; their rounds interleave",
                         default=12, type=positive_int)
    warmup: int = flag("steps per env run first in each episode and discarded", default=1, type=non_negative_int)
    overhead_rounds: int = flag("measured steps of the one-client overhead comparison", default=256, type=positive_int)
    cycles: int = flag("connect/reset/step/disconnect cycles of the memory check", default=1000, type=positive_int)
    max_wait_ms: float = flag("the server's batching window (a loaded 2-core box schedules 8 client processes "
                               "tens of ms apart)", default=100.0)
    num_steps: int | None = flag("denoise steps per window (default: the config's)", default=None)
    cache_dir: str | None = flag("checkpoint cache (default $WORLDSTEP_CACHE)", default=None)


def actions(shape: tuple[int, ...], k: int, seed: int) -> np.ndarray:
    """The k-th action chunk of client `seed` (the same for the local alternatives)."""
    return (0.8 * np.sin(k + seed + np.linspace(0, 3, int(np.prod(shape))))).reshape(shape).astype(np.float32)


def client_main(url: str, seed: int, windows: int) -> None:
    """One client process, told what to do one line at a time on stdin (`reset`, `step K`, `close`); it answers
    each with one JSON line on stdout: a step's end time and the process CPU seconds it took."""
    from worldstep.serve import RemoteWorldModelEnv

    env = RemoteWorldModelEnv(url, max_windows=windows)
    _say({"ready": True})
    for line in sys.stdin:
        op, *arg = line.split()
        if op == "close":
            break
        if op == "reset":
            env.reset(seed=seed)
            _say({})
        else:  # step K
            started = time.process_time()
            env.step(actions(env.action_space.shape, int(arg[0]), seed))
            _say({"end": time.time(), "cpu_s": time.process_time() - started})
    env.close()


def _say(reply: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


def run_serve(settings: ServeSettings, progress: Progress) -> BenchResult:
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
        rounds = _aggregate(world, server, settings, progress)
        overhead = _overhead(world, server, settings, progress)
        memory = _cycles(server, settings, progress)
    finally:
        server.drain()
    n = settings.clients
    times = {name: r.seconds for name, r in rounds.items()}
    steps_per_s = {name: ratio(n, median(t)) for name, t in times.items()}
    server_vs_vector = ratio_estimate(times["vector_env"], times["server"])
    engine = ratio_estimate(rounds["server"].engine_s, times["vector_env"])
    sizes = rounds["server"].batch_sizes
    result.results = {
        "config": settings.config, "clients": n, "steps_per_s": steps_per_s,
        "rounds_per_alternative": len(times["server"]),
        "server_vs_vector": server_vs_vector.value,
        "server_vs_vector_ci95": [server_vs_vector.low, server_vs_vector.high],
        "server_vs_separate": ratio(steps_per_s["server"], steps_per_s["separate"]),
        "server_engine_call_s": median(rounds["server"].engine_s),
        "server_engine_call_vs_vector_round": engine.value,
        "server_engine_call_vs_vector_round_ci95": [engine.low, engine.high],
        "batch_sizes": {str(k): sizes.count(k) for k in sorted(set(sizes))},
        "round_s": {name: median(t) for name, t in times.items()},
        "cpu_s_per_round": {name: r.cpu_medians() for name, r in rounds.items()}, "cores": os.cpu_count(),
        "overhead": overhead, "cycles": memory,
        "targets": {"server_vs_vector": TARGET_SERVER_VS_VECTOR, "overhead": TARGET_OVERHEAD},
    }
    result.tables += _tables(settings, result.results)
    _notes(result)
    return result


# --- 1. aggregate steps/s ----------------------------------------------------------------------------


@dataclass
class _Rounds:
    """One alternative's measured rounds: wall seconds, this process's CPU seconds (the envs, or the server's
    threads), the client processes' CPU seconds together, and (the server) its engine calls and batch sizes."""

    seconds: list[float] = field(default_factory=list)
    bench_cpu_s: list[float] = field(default_factory=list)
    clients_cpu_s: list[float] = field(default_factory=list)
    engine_s: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)

    def cpu_medians(self) -> dict[str, float]:
        cpu = {"bench_process": median(self.bench_cpu_s)}
        return {**cpu, "clients": median(self.clients_cpu_s)} if self.clients_cpu_s else cpu


def _aggregate(world, server, s: ServeSettings, progress: Progress) -> dict[str, _Rounds]:
    """Every alternative's rounds, interleaved round by round in mirrored order over `episodes` episodes."""
    from worldstep import make_env
    from worldstep.world import make_vec_env

    windows = s.warmup + s.rounds + 1
    out = {name: _Rounds() for name in ("vector_env", "server", "separate")}
    with contextlib.ExitStack() as stack:  # a failure anywhere gives every env's pages and every client back
        vec = make_vec_env(world, s.clients, max_windows=windows)
        stack.callback(vec.close)
        separate = []
        for _ in range(s.clients):
            separate.append(make_env(world, max_windows=windows))
            stack.callback(separate[-1].close)
        clients = _Clients(server.url, s.clients, windows)
        stack.callback(clients.close)
        shape = vec.single_action_space.shape

        def local(name: str, step: Callable[[int], object]) -> Callable[[int, bool], None]:
            def run(k: int, measured: bool) -> None:
                watch = Stopwatch()
                step(k)
                if measured:
                    wall, cpu = watch.elapsed()
                    out[name].seconds.append(wall)
                    out[name].bench_cpu_s.append(cpu)
            return run

        def server_round(k: int, measured: bool) -> None:
            seen, start, watch = server.loop.batches, time.time(), Stopwatch()
            replies = clients.tell(f"step {k}")  # the round ends with the last client's reply (its own clock)
            if measured:
                r, made = out["server"], server.loop.batches - seen  # this round's engine calls: the newest
                r.seconds.append(max(reply["end"] for reply in replies) - start)
                r.bench_cpu_s.append(watch.elapsed()[1])
                r.clients_cpu_s.append(sum(reply["cpu_s"] for reply in replies))
                r.engine_s.append(sum(list(server.loop.batch_seconds)[-made:]) if made else 0.0)
                r.batch_sizes += list(server.loop.batch_sizes)[-made:] if made else []

        alternatives = {
            "vector_env": local("vector_env", lambda k: vec.step(
                np.stack([actions(shape, k, seed) for seed in range(s.clients)]))),
            "server": server_round,
            "separate": local("separate", lambda k: [env.step(actions(shape, k, seed))
                                                     for seed, env in enumerate(separate)]),
        }
        for episode in range(s.episodes):
            progress(f"episode {episode + 1}/{s.episodes}: {s.clients} envs each, {s.warmup} + {s.rounds} rounds, "
                     "the alternatives taking turns")
            vec.reset(seed=list(range(s.clients)))
            for seed, env in enumerate(separate):
                env.reset(seed=seed)
            clients.tell("reset")
            for k in range(s.warmup + s.rounds):
                for name in (alternatives if k % 2 == 0 else reversed(alternatives)):
                    alternatives[name](k, k >= s.warmup)
    return out


class _Clients:
    """`n` client processes (`client_main`) that live through the comparison and act together when told."""

    def __init__(self, url: str, n: int, windows: int) -> None:
        code = "import sys; from worldstep.bench.serve import client_main as m; m(sys.argv[1], int(sys.argv[2]), " \
               "int(sys.argv[3]))"
        self.procs = [subprocess.Popen([sys.executable, "-c", code, url, str(i), str(windows)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE) for i in range(n)]
        self._buffers = [b"" for _ in self.procs]
        try:
            self._replies()  # each says it is connected
        except BaseException:
            self.close()
            raise

    def tell(self, command: str) -> list[dict[str, Any]]:
        """Send `command` to every client at once; each client's reply."""
        for i, proc in enumerate(self.procs):
            try:
                proc.stdin.write(command.encode() + b"\n")
                proc.stdin.flush()
            except OSError:  # its end of the pipe is gone
                raise RuntimeError(f"bench serve: client process {i} exited with {_exit_code(proc)}") from None
        return self._replies()

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):  # a client that already died
                proc.stdin.write(b"close\n")
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()

    def _replies(self) -> list[dict[str, Any]]:
        return [json.loads(self._line(i)) for i in range(len(self.procs))]

    def _line(self, i: int) -> bytes:
        """Client i's next line, read straight from its pipe (no buffered reader between select and read)."""
        proc, deadline = self.procs[i], time.monotonic() + CLIENT_TIMEOUT_S
        while b"\n" not in self._buffers[i]:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
            chunk = os.read(proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                raise RuntimeError(f"bench serve: client process {i} " + (
                    f"exited with {_exit_code(proc)}" if ready else f"answered nothing in {CLIENT_TIMEOUT_S:g} s"))
            self._buffers[i] += chunk
        line, self._buffers[i] = self._buffers[i].split(b"\n", 1)
        return line


def _exit_code(proc: subprocess.Popen) -> int | str:
    """The exit status of a client whose pipe closed: its end of the pipe closes before the process is reaped,
    so `poll()` right then can still read None; wait for it, bounded."""
    try:
        return proc.wait(timeout=CLIENT_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return f"nothing yet (its pipe closed {CLIENT_EXIT_WAIT_S:g} s ago and it still runs)"


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
    estimate = ratio_estimate(samples["remote"].seconds, samples["local"].seconds)
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
        note=(f"Medians of {r['rounds_per_alternative']} rounds per alternative ({s.episodes} episodes of "
              f"{s.warmup} + {s.rounds} steps), the alternatives taking turns round by round in mirrored order; the "
              f"server runs in the bench process on loopback (--max-wait-ms {s.max_wait_ms:g}), each client is its "
              "own process, told to step by one line on its stdin. The interval is a bootstrap over the paired "
              "rounds."))
    sps = r["steps_per_s"]
    agg.add(sps["separate"], sps["vector_env"], sps["server"], _with_interval(r["server_vs_vector"],
            r["server_vs_vector_ci95"]), r["server_vs_separate"])
    cpu = r["cpu_s_per_round"]
    where = Table(title=f"Where a round goes, {s.config}, {s.clients} envs: CPU seconds per round (median)", columns=[
        "alternative", "round wall s", "bench process CPU s", "client processes CPU s", "CPU / (wall x cores)"],
        note=f"{r['cores']} cores. The bench process runs the envs, or the server's threads; each client is its "
             "own process (its decode of the frames, msgpack, websockets). A share near 1 means the round waits "
             f"for CPU, not for the model. The server's engine call takes {r['server_engine_call_s']:.3f} s of its "
             "round (median), "
             f"{_with_interval(r['server_engine_call_vs_vector_round'], r['server_engine_call_vs_vector_round_ci95'])}"
             "x the vector env's whole round; the rest of the server's round is serving: the word to the clients, "
             "their steps in, the batch filling, the replies out.")
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
