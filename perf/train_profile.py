#!/usr/bin/env python3
"""Where a pipetrain step's time goes, per thread, against each operation alone (issue 22).

    python3 perf/train_profile.py RUN.json TRACE.json LOG.csv BENCH.txt ROOFLINE.txt

RUN.json: pipetrain --json; TRACE.json: its --trace (the last step); LOG.csv: its --log; BENCH.txt:
perf/bench_mlp_train at the run's micro-batch (each layer's F, B_in, B_w and end-of-step update U alone,
our kernels, one core); ROOFLINE.txt: perf/bench_mlp_train --roofline at the same micro-batch (each
sgemm alone at the rate both cores reach at once).

Per thread: time inside each kind of operation in the traced step, the same operations' sum alone
(bench) and at the roofline's sgemm rate, the time between its operations (waits for a hop: the bubble
and the hand-offs), and the end of the step (check, update, barriers: the wall time per step, from the
log's elapsed_s over its second half, less the operations' span, step_ms). Prints a Markdown table.
"""
import csv
import json
import re
import sys


def per_layer(path, cols):
    """{layer: {col: us}} from bench_mlp_train's table rows."""
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 3 and f[0].isdigit() and re.match(r"^\d+x\d+$", f[1]):
            out.setdefault(int(f[0]), {}).update(cols(f))
    return out


def bench_cols(f):
    return {"F": float(f[2]), "B_in": float(f[3]), "W": float(f[4]), "U": float(f[7])}


def roof_cols(f):
    return {{"F": "F", "B_in": "B_in", "B_w": "W"}[f[2]]: float(f[5])}


def main(run, trace, log, bench, roof):
    cfg = json.load(open(run))
    stages = cfg["stages"]
    M = cfg["config"]["mbs"]
    alone, rl = per_layer(bench, bench_cols), per_layer(roof, roof_cols)
    rows = list(csv.DictReader(open(log)))
    half = rows[len(rows) // 2 :]
    wall = (float(half[-1]["elapsed_s"]) - float(half[0]["elapsed_s"])) * 1e3 / (len(half) - 1)
    span = sorted(float(r["step_ms"]) for r in half)[len(half) // 2]
    last = float(rows[-1]["step_ms"])  # the traced step's
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    print(f"step: wall {wall:.2f} ms (log's second half), operations' span {span:.2f} ms (median), "
          f"end of step {wall - span:.2f} ms; {M} micro-batches")
    print("| thread (layers) | kind | traced ms | alone ms (ratio) | roofline sgemm ms |")
    print("| --- | --- | --- | --- | --- |")
    for s, st in enumerate(stages):
        a, b = st["first_layer"], st["last_layer"]
        mine = [e for e in ev if e["tid"] == s]
        # what this stage's operations compute, layer by layer: B_in of its first layer only where it
        # takes a hand-over (the previous stage's last layer's B_in is then its own)
        take = s > 0 and stages[s - 1]["hands_over"]
        lay = {"F": range(a, b + 1), "W": range(a, b + 1),
               "B_in": range(a - 1 if take else a, b + 1 if not st["hands_over"] else b)}
        busy = 0.0
        for k in ("F", "B_in", "W"):
            t = sum(e["dur"] for e in mine if e["cat"] == k) / 1e3
            busy += t
            al = M * sum(alone[i][k] for i in lay[k] if i > 0 or k != "B_in") / 1e3
            ro = M * sum(rl.get(i, {}).get(k, 0) for i in lay[k]) / 1e3
            print(f"| {s} ({a}-{b}) | {k} | {t:.2f} | {al:.2f} ({t / al if al else 0:.2f}x) | {ro:.2f} |")
        u = sum(alone[i]["U"] for i in range(a, b + 1)) / 1e3
        first = min(e["ts"] for e in mine) / 1e3
        end = max(e["ts"] + e["dur"] for e in mine) / 1e3
        print(f"| {s} | between operations (waits, hops, bubble) | {end - first - busy:.2f} "
              f"(+{first:.2f} before the first, {last - end:.2f} after the last) | | |")
        print(f"| {s} | update alone (norm, AdamW, copy, zero) | | {u:.2f} | |")
    limit = float(re.search(r"limit_sps=(\d+)", open(roof).read()).group(1))
    print(f"| all | roofline step (sum of sgemm / 2) | {cfg['config']['batch'] * 1e3 / limit:.2f} | | |")


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
