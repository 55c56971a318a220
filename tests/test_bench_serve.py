"""`worldstep bench serve` end to end at toy sizes: the JSON's structure and the figures that must hold whatever the
machine's speed (every cycle gives its pages back). No timing assertions."""

from __future__ import annotations

import json
import math
import socket

import pytest
from tiny_world import cache_dir, world  # noqa: F401 - fixtures (a private WORLDSTEP_CACHE, a tiny world)
from worldstep.bench import main


def test_bench_serve_writes_its_figures(tmp_path, cache_dir):  # noqa: F811
    path = tmp_path / "serve.json"
    assert main(["serve", "--json", str(path), "--threads", "1", "--quiet", "--config", "tiny", "--clients", "2",
                 "--rounds", "1", "--episodes", "2", "--warmup", "0", "--overhead-rounds", "1", "--cycles", "3"]) == 0
    doc = json.loads(path.read_text())
    r = doc["results"]
    assert doc["bench"] == "serve" and r["clients"] == 2
    assert r["rounds_per_alternative"] == 2  # 2 episodes x 1 measured round, the alternatives taking turns
    assert set(r["steps_per_s"]) == {"server", "separate", "vector_env"}
    assert all(math.isfinite(v) and v > 0 for v in r["steps_per_s"].values())
    assert r["cycles"]["pages_in_use"] == [0, 0, 0] and r["cycles"]["pages_flat"]
    assert set(r["batch_sizes"]) <= {"1", "2"} and r["overhead"]["ratio"] > 0
    assert [len(t["rows"]) for t in doc["tables"]] == [1, 3, 1, 1]
    cpu = r["cpu_s_per_round"]  # where a round goes: this process's CPU for every alternative, the clients' for one
    assert set(cpu) == {"server", "separate", "vector_env"} and set(cpu["server"]) == {"bench_process", "clients"}
    assert all(v > 0 for c in cpu.values() for v in c.values()) and "clients" not in cpu["vector_env"]
    lo, hi = r["server_vs_vector_ci95"]
    assert lo <= r["server_vs_vector"] <= hi and lo <= hi
    assert r["server_engine_call_s"] > 0  # the engine call measured apart from the round it sits in
    lo, hi = r["server_engine_call_vs_vector_round_ci95"]
    assert lo <= r["server_engine_call_vs_vector_round"] <= hi
    assert sum(r["batch_sizes"].values()) >= 2  # every measured server round made at least one engine call
    assert r["overhead"]["ratio_ci95"][0] <= r["overhead"]["ratio"] <= r["overhead"]["ratio_ci95"][1]


@pytest.mark.parametrize(("flag", "value", "minimum"), [(f, "0", 1) for f in (
    "--clients", "--rounds", "--episodes", "--overhead-rounds", "--cycles")] + [("--warmup", "-1", 0)])
def test_a_count_below_its_minimum_is_refused_before_any_work(flag, value, minimum, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--quiet", "--config", "no-such-model", flag, value])  # loading the model would fail too
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}: {value} is invalid; allowed: an int >= {minimum}" in err


def test_a_failure_mid_comparison_gives_back_every_page_and_client(world, monkeypatch):  # noqa: F811
    from worldstep.bench import serve as bench
    from worldstep.serve.server import WorldModelServer

    told, started = bench._Clients.tell, []

    def tell(self, command):
        started[:] = self.procs
        if command.startswith("step"):  # every env has reset (pages held), then the comparison fails
            raise RuntimeError("injected failure")
        return told(self, command)

    monkeypatch.setattr(bench._Clients, "tell", tell)
    settings = bench.ServeSettings(config="tiny", clients=2, rounds=1, episodes=1, warmup=0)
    with WorldModelServer(world, max_batch=2, max_wait_ms=10) as server:
        with pytest.raises(RuntimeError, match="injected failure"):
            bench._aggregate(world, server, settings, progress=lambda message: None)
        assert len(started) == 2 and all(proc.returncode == 0 for proc in started)  # each closed its session
        assert server.open_sessions() == 0
    assert world.model.kv.num_used_pages == 0 and world.model.decoder.live_warm_sessions == 0


def test_a_client_process_that_fails_is_named_not_waited_for():
    from worldstep.bench.serve import _Clients

    with socket.socket() as sock:  # a free loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"ws://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(RuntimeError, match="client process 0 exited with 1"):
        _Clients(url, n=1, windows=2)


def test_a_client_whose_pipe_closes_before_it_exits_is_named_with_its_status():
    """The race CI met: the pipe reads EOF while the process is not yet reaped, so `poll()` said None."""
    import subprocess
    import sys

    from worldstep.bench.serve import _Clients

    code = "import os, sys, time; os.close(1); time.sleep(0.5); sys.exit(3)"  # EOF first, the exit 0.5 s later
    clients = object.__new__(_Clients)
    clients.procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)]
    clients._buffers = [b""]
    try:
        with pytest.raises(RuntimeError, match="client process 0 exited with 3$"):
            clients._line(0)
    finally:
        clients.close()


def test_a_target_counts_as_met_only_on_its_interval():
    from worldstep.bench.measure import ratio_estimate
    from worldstep.bench.results import BenchResult
    from worldstep.bench.serve import _notes

    fast, slow = [0.10, 0.08, 0.10, 0.07, 0.10, 0.09], [0.10] * 6  # vector rounds, server rounds
    estimate = ratio_estimate(fast, slow)  # a median ratio near 1 whose interval reaches below 0.9
    assert 0.9 <= estimate.value <= estimate.high and estimate.low < 0.9

    def notes(vector: list[float], overhead: list[float]) -> list[str]:
        result = BenchResult("serve", {}, settings={})
        result.results = {"server_vs_vector": estimate.value, "server_vs_vector_ci95": vector, "batch_sizes": {},
                          "overhead": {"ratio": 1.0, "ratio_ci95": overhead}}
        _notes(result)
        return result.notes

    assert notes([0.95, 1.05], [0.98, 1.04]) == []
    assert [n.split(" [")[0] for n in notes([estimate.low, estimate.high], [0.98, 1.06])] == [
        f"server / vector env {estimate.value:.2f}", "one remote client costs 1.00"]
    assert len(notes([float("nan"), float("nan")], [1.0, 1.0])) == 1  # an undefined interval is not met
