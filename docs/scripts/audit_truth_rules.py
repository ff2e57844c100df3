"""Rule variants replayed on saved audit-truth pools, scored against a truth held out from the replay.

    .venv/bin/python docs/scripts/audit_truth_rules.py --cadence 1,2,4 --max-age 5 GRAM.npz [GRAM.npz ...]

Each ``gram-<step>.npz`` (``adwin bench audit-truth`` writes one per checkpoint) is split in halves
(``adwin.audit.truth.split_pool``, ``--split``): the truth is read from one, and every rule below is replayed on the
other through the product's ``adwin.bench.audit_replay.held_out``, beside the noise-reading rule, at the run's P and
at 8, from the run's initial window (saved with the pool; else 128 on a 320-token horizon and 512 otherwise: the
suite's ``window.initial``), ``--runs`` runs of ``--audits`` audits, ``--cadence`` steps between audits and no pooled audit older than ``--max-age`` (the
staleness limit). Prints per checkpoint the verdict (truth's window against the noise-reading window) and, per rule
and cadence, the exact, admissible and unsafe shares and the cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from adwin.audit import truth
from adwin.bench.audit_replay import NOISE_RULE, SPLITS, Rule, held_out
from adwin.bench.audit_truth import _load_npz

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
    p.add_argument("--audits", type=int, default=12)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--split", choices=SPLITS, default="half")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    for path in args.npz:
        ck = _load_npz(Path(path))
        cands, horizon = ck["candidates"], ck["horizon"]
        halves = truth.split_pool(ck["h"].shape[0], seed=args.seed)
        # None: the largest candidate; pools saved before window.initial was recorded: the suite's
        initial = ck["meta"]["initial"] if "initial" in ck["meta"] else (128 if horizon == 320 else 512)
        for i, (t, r) in enumerate([halves] if args.split == "half" else [halves, halves[::-1]]):
            for cadence in (int(c) for c in args.cadence.split(",")):
                fold = held_out(ck["h"], cands, horizon, 0.7, truth_idx=t, replay_idx=r,
                                p_run=sorted({int(ck["meta"]["probe_batch"]), 8}), audits=args.audits, runs=args.runs,
                                rng=rng, lengths=ck["lengths"], rules=RULES, initial=initial, cadence=cadence,
                                max_age=args.max_age)
                where = f"{ck['meta']['task']}@{ck['step']} fold {i + 1} cadence {cadence}"
                sys.stdout.write(f"{where}: truth {fold['truth_window']}, noise reading {fold['noise_window']} "
                                 f"({fold['direction']})\n")
                for size, scores in fold["replay"].items():
                    for name in [NOISE_RULE, *(r.name for r in RULES)]:
                        s = scores[name]
                        cells = " ".join(f"{m} {'n/a' if s[m] is None else format(s[m]['share'], '.2f')}"
                                         for m in ("exact", "admissible", "unsafe", "cost"))
                        sys.stdout.write(f"  P{size} {name}: {cells}\n")


if __name__ == "__main__":
    main()
