"""The sampler sweep's table (tools/sampler_sweep.sh): one row per (num_steps, flow_shift), the 8 non-floor policies.

    python tools/sampler_sweep_table.py runs/sweep
"""
import json
import sys
from pathlib import Path


def fmt(m):
    return f"{m['value']:.2f} [{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}]"

rows = []
for path in sorted(Path(sys.argv[1]).glob("s*_f*/report.json")):
    d = json.loads(path.read_text())
    a, w = d["args"], d["policies"]["without_floor"]
    p = w["precision"]
    rows.append((a["num_steps"], a["flow_shift"], f"{fmt(p)} ({p['confirmed']} / {p['reported_successes']})",
                 fmt(w["false_success_rate"]), fmt(w["missed_success_rate"]), fmt(w["spearman"]),
                 fmt(w["mean_abs_rate_error"]), fmt(d["policies"]["block_lost_rate"]), f"{d['seconds'] / 60:.1f}"))
COLUMNS = ["num_steps", "flow_shift", "precision of successes (confirmed / reported)", "false success, strict",
           "missed success", "Spearman", "mean abs rate error", "block lost", "minutes"]
print("| " + " | ".join(COLUMNS) + " |")
print("|---|---|---|---|---|---|---|---|---|")
for r in sorted(rows):
    print("| " + " | ".join(str(x) for x in r) + " |")
