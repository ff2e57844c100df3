"""Rule variants replayed on saved audit-truth pools: the table of docs/benchmarks.md, "Audit truth".

    .venv/bin/python docs/scripts/audit_truth_rules.py --cadence 1,2,4 --max-age 5 GRAM.npz [GRAM.npz ...]

Each ``gram-<step>.npz`` (``adwin bench audit-truth`` writes one per checkpoint) is replayed through the product's
``adwin.bench.audit_truth.replay`` for every rule below, at the run's P and at 8, from the run's initial window (128 on
a 320-token horizon, else 512: the suite's ``window.initial``), ``--runs`` runs of 12 audits, ``--cadence`` steps
between audits and no pooled audit older than ``--max-age`` (the staleness limit). Prints one line per replay and,
per rule and cadence, the share of decisions within one rung of the truth's window at every checkpoint.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from adwin.audit import truth
from adwin.bench.audit_truth import Rule, _load_npz, replay

RULES = [
    Rule("paper (batch, point)", "batch", False),
    Rule("batch, confidence", "batch", True),
    Rule("debiased, point", "debiased", False),
    Rule("debiased, confidence, noise hold", "debiased", True, noise_hold=True),
    Rule("batch, point, 4 audits pooled", "batch", False, pool=4),
    Rule("batch, point, 8 audits pooled (decay 0.9)", "batch", False, pool=8, decay=0.9),
    Rule("batch, confidence, 8 audits pooled (decay 0.9)", "batch", True, pool=8, decay=0.9),
]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("npz", nargs="+")
    p.add_argument("--cadence", default="1")
    p.add_argument("--max-age", type=int, default=5)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    table: dict[str, dict[str, float]] = {}
    for path in args.npz:
        ck = _load_npz(path)
        cands, horizon = ck["candidates"], ck["horizon"]
        if not truth.identifiable(ck["h"]):  # no truth to land on (adwin bench audit-truth says so)
            sys.stdout.write(f"{ck['meta']['task']}@{ck['step']}: truth not identifiable, skipped\n")
            continue
        pop = truth.population_interval(ck["h"], cands)
        window = truth.truth_window({c: v[0] for c, v in pop.items()}, cands, horizon, 0.7)
        initial = 128 if horizon == 320 else 512
        for size in sorted({int(ck["meta"]["probe_batch"]), 8}):
            for cadence in (int(c) for c in args.cadence.split(",")):
                for rule in RULES:
                    r = replay(ck["h"], cands, horizon, 0.7, rule, p=size, audits=12, runs=args.runs,
                               truth_window=window, rng=rng, initial=initial, cadence=cadence, max_age=args.max_age)
                    where = f"{ck['meta']['task']}@{ck['step']} P{size}"
                    table.setdefault(f"{rule.name}, cadence {cadence}", {})[where] = r["within_one_rung"]
                    sys.stdout.write(f"{where} {rule.name} cadence {cadence} {r['within_one_rung']:.2f}\n")
    for name, row in table.items():
        cells = " | ".join(f"{k} {v:.2f}" for k, v in row.items())
        sys.stdout.write(f"{name} | {cells} | worst {min(row.values()):.2f}\n")


if __name__ == "__main__":
    main()
