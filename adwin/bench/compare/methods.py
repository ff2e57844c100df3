"""The methods ``adwin bench compare`` runs: each a key, a label and the config overrides that make it, and
how ``--methods`` and the defaults pick among them (``adwin/bench/compare/command.py`` runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

THRESHOLDS = (0.7, 0.5, 0.6, 0.8, 0.9)  # the default first, then appendix D's sensitivity
ASYNC_LAGS = (1, 4, 16)  # learner updates between two syncs of the rollout workers' weights
IW_GAMMA = 0.5
FAST_OPD = (256, 256, 8192)  # Fast OPD: start 256, +256 per step, at a horizon of 8192


@dataclass(frozen=True)
class Method:
    key: str
    label: str
    overrides: dict[str, Any] = field(default_factory=dict)
    adaptive: bool = False  # its window changes during the run (plotted over steps)
    opt_in: bool = False  # run only when named in --methods
    rung: int | None = None  # a fixed window's place in its task's ladder, 1 = the shortest

    def suite_names(self) -> list[str]:
        """Its names across tasks: a fixed window is also ``fixed-rung<k>`` (the same rung of every
        task's ladder), so windows of different tasks' ladders compare in one regret row."""
        return [self.key] if self.rung is None else [f"fixed-rung{self.rung}", self.key]


def fast_opd_schedule(max_len: int) -> int:
    """Fast OPD's start (= step) scaled to ``max_len`` as 256 is to 8192 (10 at 320), at least 1."""
    start, _, horizon = FAST_OPD
    return max(1, round(start * max_len / horizon))


def asyncopd_methods(samples_per_step: int, window_policy: str = "adwin") -> list[Method]:
    """IS and OAPL under the AsyncOPD scheduler at each lag of ``ASYNC_LAGS`` (module docstring)."""
    from adwin.config import policy_overrides
    from adwin.policies.registry import is_audited

    g = 4 if samples_per_step % 4 == 0 else 2 if samples_per_step % 2 == 0 else samples_per_step
    window = policy_overrides("full") if is_audited(window_policy) else {}
    # wait_timeout_s: a shared machine may pause the whole process (SIGSTOP) for minutes; the pipeline's
    # stall detector counts that wall time, so it gets an hour here instead of ten minutes
    # probes.backend back to its default: compare's base picks inline probe workers, which the pipeline runs none of
    common = window | {"scheduler": "asyncopd", "probes.backend": "auto", "asyncopd.queue_depth": 1,
                       "asyncopd.pad_to_horizon": False,
                       "asyncopd.wait_timeout_s": 3600.0,
                       "rollout.prompts_per_step": samples_per_step // g, "rollout.samples_per_prompt": g}
    out = [Method(f"asyncopd-is-L{lag}", f"AsyncOPD + IS (lag {lag})",
                  common | {"loss.name": "reverse_kl_pg", "asyncopd.sync_every": lag}, opt_in=True) for lag in ASYNC_LAGS]
    out += [Method(f"asyncopd-oapl-L{lag}", f"AsyncOPD + OAPL (lag {lag}, beta 1, teacher reward)",
                   common | {"loss.name": "oapl", "loss.oapl.lag": lag}, opt_in=True) for lag in ASYNC_LAGS]
    return out


def all_methods(max_len: int, candidates: list[int], samples_per_step: int = 16,
                window_policy: str = "adwin") -> list[Method]:
    from adwin.config import policy_overrides

    s = fast_opd_schedule(max_len)
    out = [Method("full", "OPD (full rollout)", policy_overrides("full")),
           Method("linear", f"Fast OPD (linear {s}/+{s})", policy_overrides("linear", start=s, step=s), adaptive=True)]
    out += [Method(f"fixed-{c}", f"Prefix OPD-{c}", policy_overrides("fixed", window=c), rung=i + 1)
            for i, c in enumerate(candidates)]
    out += [Method(f"adwin-{t}", f"ADWIN (tau={t})", policy_overrides("adwin", threshold=t), adaptive=True)
            for t in THRESHOLDS]
    out += [Method("surprise", "teacher-surprise horizon", policy_overrides("surprise"), adaptive=True),
            Method("iw-opd", f"IW-OPD (gamma={IW_GAMMA})", policy_overrides("full") | {"loss.iw_gamma": IW_GAMMA})]
    return out + asyncopd_methods(samples_per_step, window_policy)


def quick_keys(candidates: list[int]) -> list[str]:
    """The reduced set of smoke runs: one of each family."""
    return ["full", "linear", f"fixed-{candidates[len(candidates) // 2]}", "adwin-0.7", "surprise", "iw-opd"]


def suite_keys(candidates: list[int]) -> list[str]:
    """The default methods of a compare across several tasks: those the suite's goal weighs ADWIN-0.7 against
    (full, every fixed window, the linear schedule). The threshold sweep, surprise and IW-OPD stay one
    ``--methods`` away; all fourteen on three tasks do not fit the suite's budget on 2 cores."""
    return ["full", "linear", *(f"fixed-{c}" for c in candidates), "adwin-0.7"]


def suite_quick_keys(candidates: list[int]) -> list[str]:
    """The goal's methods in a smoke run across tasks: one fixed window, the middle rung."""
    return ["full", "linear", f"fixed-{candidates[len(candidates) // 2]}", "adwin-0.7"]


def select_methods(spec: str | None, methods: list[Method], default_keys: list[str] | None) -> list[Method]:
    """``--methods``: comma-separated keys; a family name (``fixed``, ``adwin``) selects all its members."""
    by_key = {m.key: m for m in methods}
    if not spec:
        keys = default_keys or [m.key for m in methods if not m.opt_in]
    else:
        keys = []
        for name in (x.strip() for x in spec.split(",") if x.strip()):
            family = [k for k in by_key if k.startswith(f"{name}-")]
            rung = [m.key for m in methods if name in m.suite_names() and name != m.key]
            if name in by_key:
                keys.append(name)
            elif rung:
                keys += rung  # fixed-rung<k>: the task's k-th candidate
            elif family:
                keys += family
            else:
                raise ValueError(f"--methods: unknown method {name!r}; known: {', '.join(by_key)} (or fixed, fixed-rung<k>, adwin, "
                                 "asyncopd-is, asyncopd-oapl)")
    if "full" not in keys:
        keys.insert(0, "full")  # every ratio is to full-rollout OPD
    return [by_key[k] for k in dict.fromkeys(keys)]
