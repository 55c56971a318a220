"""`worldstep bench serve` end to end at toy sizes: the JSON's structure and the figures that must hold whatever the
machine's speed (every cycle gives its pages back). No timing assertions."""

from __future__ import annotations

import json
import math

from tiny_world import cache_dir  # noqa: F401 - fixture (a private WORLDSTEP_CACHE)
from worldstep.bench import main


def test_bench_serve_writes_its_figures(tmp_path, cache_dir):  # noqa: F811
    path = tmp_path / "serve.json"
    assert main(["serve", "--json", str(path), "--threads", "1", "--quiet", "--config", "tiny", "--clients", "2",
                 "--rounds", "1", "--warmup", "0", "--overhead-rounds", "1", "--cycles", "3"]) == 0
    doc = json.loads(path.read_text())
    r = doc["results"]
    assert doc["bench"] == "serve" and r["clients"] == 2
    assert set(r["steps_per_s"]) == {"server", "separate", "vector_env"}
    assert all(math.isfinite(v) and v > 0 for v in r["steps_per_s"].values())
    assert r["cycles"]["pages_in_use"] == [0, 0, 0] and r["cycles"]["pages_flat"]
    assert set(r["batch_sizes"]) <= {"1", "2"} and r["overhead"]["ratio"] > 0
    assert [len(t["rows"]) for t in doc["tables"]] == [1, 3, 1, 1]
    cpu = r["cpu_s_per_round"]  # where a round goes: this process's CPU for every alternative, the clients' for one
    assert set(cpu) == {"server", "separate", "vector_env"} and set(cpu["server"]) == {"bench_process", "clients"}
    assert all(v > 0 for c in cpu.values() for v in c.values()) and "clients" not in cpu["vector_env"]
