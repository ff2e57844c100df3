"""The metrics glossary: what every logged key means, and the scanner that keeps it honest.

Every step's metrics are one flat dict of namespaced keys (``probe/tokens``, ``audit/micro_cos_64``...), sent to
JSONL, stdout, wandb and the controller. ``NAMESPACES`` says what each namespace is about, ``KEYS`` what each key
means; ``<c>`` in a key stands for a candidate window, ``<k>`` and ``<q>`` for the other numbers a key carries.
``emitted_keys`` finds the keys the source code writes as literals; tests/adwin/runtime/test_glossary.py also
runs short sync and AsyncOPD runs and checks that every key they log, and every literal key of the code, is
documented here, and that nothing documented here is gone from the code. ``python -m adwin.runtime.glossary``
prints docs/metrics.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

NAMESPACES: dict[str, str] = {
    "rollout": "the step's training rollouts: tokens generated, how many the window cut, what a full-rollout run "
               "would have generated, and the gap between the sampler's and the learner's logprobs",
    "loss": "the training loss of the step and its diagnostics (importance ratios, teacher KL of the sampled tokens)",
    "optim": "the optimizer step: gradient norm, learning rate, non-finite steps skipped",
    "window": "the window the step trained under and why, as the controller answered it",
    "probe": "probes: offers, extension rounds, forced completions, workers; what decisions cost the learner",
    "audit": "prefix-full alignment audits: the cosines measured, their intervals, lag, staleness and the next window",
    "decision": "the decision budget (`audit.budget`, docs/decisions.md \"Decision budget\"): what ADWIN's decisions "
                "(probe extension, the teacher's scoring of probe batches, drift diagnostics, audits) cost, as a share "
                "of the run's FLOPs and of the learner's measured seconds, cumulative since the run started",
    "drift": "teacher-side diagnostics of an audited probe batch (paper section 3.1): where the student's rollout "
             "leaves the teacher's support",
    "eval": "held-out evaluation of the student (at step 0, every `eval.every` steps and at the end). On the built-in "
            "tasks also how far each response gets, where final-answer accuracy needs every one of up to 145 lines "
            "right: `eval/lines_right` is 1 for a right chain, k / n when line k + 1 of n is the first wrong one "
            "(every character and the newline must match), 0 for garbage; `eval/closing_right` judges the closing "
            "line on the chain line written above it, right or wrong (`adwin.tasks.suite.BuiltinTask.score_lines`)",
    "time": "wall-clock seconds of the step's phases; `time/wall` since the run started",
    "controller": "the degraded-mode wrapper's gauges while a remote controller is away",
    "async": "the AsyncOPD streaming scheduler: versions, staleness, permits, throughput",
    "pipeline": "the AsyncOPD pipeline's stages: busy seconds per stage and how much they overlapped",
    "oapl": "the OAPL learner (`loss.name: oapl`): rewards, group values, advantages, sequence log-ratios",
}

# key pattern -> meaning. <c>: a candidate window; <k>, <q>: other numbers carried in the key.
KEYS: dict[str, str] = {
    "step": "the optimizer step (learner update) the row belongs to",
    # rollout
    "rollout/sync_tokens": "response tokens of the step's training rollouts (generated under the window)",
    "rollout/sync_tokens_total": "`rollout/sync_tokens` summed over the run so far",
    "rollout/full_equiv_tokens": "response tokens a full-rollout run would have generated for the same rollouts "
                                 "(a cut rollout counts its full length where a probe measured it, else the horizon)",
    "rollout/full_equiv_tokens_total": "`rollout/full_equiv_tokens` summed over the run so far",
    "rollout/truncated_frac": "share of the step's rollouts the window cut before they finished",
    "rollout/mean_len": "mean response length of the step's rollouts",
    "rollout/decode_steps": "token positions the step's training rollout call decoded (its rows side by side; riding "
                            "probe rows included): on a GPU a decode step costs about the same for 1 row or 64",
    "rollout/prompt_tokens": "prompt tokens of the step's rollouts (the FLOPs estimate counts them)",
    "rollout/logprob_gap_mean": "mean |log p_learner - log p_sampler| over the trained tokens: staleness plus any "
                                "mismatch between the rollout engine and the learner",
    "rollout/logprob_gap_tokens": "tokens the gap was measured on",
    "rollout/logprob_gap_<q>": "percentile q (p50, p90, p99) or the max of that gap",
    "rollout/compile_s": "seconds torch spent compiling the student's decode step since the previous step "
                         "(`rollout.compile`; rollouts, probe rounds, evaluation: the whole process)",
    "rollout/compiled_shapes": "distinct (rows, cache columns) shapes the student's decoders compiled so far",
    "rollout/surprise_horizon": "the teacher-surprise horizon of the step (the `surprise` policy's input)",
    "rollout/surprise_position_q": "quantile (`window.surprise.quantile`) over samples of the position of the "
                                   "rank-th token the teacher finds surprising",
    "rollout/surprise_reached_frac": "share of samples that reached that many surprising tokens",
    "rollout/surprise_lost_frac": "share of response tokens whose teacher logprob is below "
                                  "`window.surprise.threshold`",
    # loss
    "loss/total": "the loss the optimizer stepped on",
    "loss/value": "the OPD loss value (one micro-batch's or the AsyncOPD learner's)",
    "loss/tokens": "response tokens the loss counted (inside the window)",
    "loss/teacher_kl": "mean k1 estimate of KL(student || teacher) on the sampled tokens",
    "loss/teacher_kl_k3": "the same KL by the k3 estimator",
    "loss/logprob_abs_diff": "mean |log p_student - log q_teacher| of the sampled tokens",
    "loss/is_ratio_<q>": "percentile q (p50, p90, p99) or the max of the old-to-current importance ratio "
                         "p_theta / p_behavior of the trained tokens",
    "loss/is_frac_affected": "share of tokens the IS treatment (`loss.is_method`) capped, clipped or masked",
    "loss/clip_frac": "share of tokens the PPO clip (`loss.clip_low/high`) was active on",
    "loss/iw_weight_mean": "mean IW-OPD token weight (`loss.iw_gamma`)",
    "loss/topk_teacher_mass": "teacher probability mass of its top-k tokens (`forward_kl_topk`)",
    "loss/topk_student_mass": "student probability mass on the teacher's top-k tokens",
    # optim
    "optim/grad_norm": "gradient norm before clipping (of the trainable parameters: a LoRA student's adapters)",
    "optim/lr": "learning rate of the step",
    "optim/skipped": "1 when the step was skipped for a non-finite loss or gradient",
    "optim/skipped_steps": "non-finite steps skipped so far",
    "optim/consecutive_skipped": "non-finite steps skipped in a row (the run stops at `optim.max_bad_steps`)",
    # window
    "window/current": "the window (response-token cap) the step trained under",
    "window/reason": "why the controller answered that window (`initial`, `audit`, `unresolved`, `schedule`, "
                     "`fallback`)",
    "window/cos_<c>": "the cosine at candidate c of the audit that decided the current window",
    "window/changes_per_audit": "audits whose decision changed the window, over all decisions so far",
    "window/size": "the window the TRL callback / generic client / verl adapter applied at this step",
    "window/rollout": "mean window of the rows TRL's async trainer trained on in the logging window (adwin's "
                      "rollout worker stamps each row with the cap it was generated under)",
    "window/bad_answers": "controller answers outside [1, max_len] so far, each refused with the window kept "
                          "(TRL async trainer)",
    "window/next": "the window the audit of this step decided for the next step (TRL callback)",
    "window/cos@<c>": "the last audit's cosine at candidate c (generic client, TRL callback, verl adapter)",
    # probe
    "probe/offered": "rollouts offered as probes this step (unfinished prefixes; finished ones per "
                     "`probes.offer_finished`)",
    "probe/accepted": "offers the controller accepted as probes",
    "probe/step": "1 on a step that carries probe copies to the horizon, 0 on one that ends at the window (the verl "
                  "adapter's adwin.probe_every)",
    "probe/active": "probes being extended",
    "probe/completed": "probes completed this step",
    "probe/forced": "probes force-completed at the staleness limit S",
    "probe/force_complete": "probes the controller asked to force-complete at this sync (AsyncOPD)",
    "probe/tokens": "tokens generated by probe extension this step",
    "probe/tokens_total": "probe tokens generated so far",
    "probe/pool": "probes held by the probe side (extending or waiting for an audit)",
    "probe/staleness_max": "largest staleness (versions behind the learner) of the probes extended this step",
    "probe/staleness_mean": "mean staleness of the probes extended this step",
    "probe/blocked_s": "seconds the step waited for probes (every inline round; forced completions for workers)",
    "probe/sync_s": "seconds spent publishing the learner's weights to the probe workers",
    "probe/in_flight": "extension rounds running on workers",
    "probe/rider_rows": "probes.backend rollout: probe rows the step's rollout generate call carried",
    "probe/rider_share": "probes.backend rollout: the probe rows' share of that call's rows",
    "probe/rider_s": "probes.backend rollout: wall seconds of the rollout call that carried probe rows (the whole call)",
    "probe/rider_capped": "probes.backend rollout: riding rows whose round budget the rollout call's window capped "
                          "(the rest of the probe continues in a later round)",
    "probe/decode_steps": "decode steps probe work added in the step: rounds applied (inline, forced, a worker's), and "
                          "the steps riding rows lengthened the rollout call by (`rollout/decode_steps` has the call)",
    "probe/submitted": "extension rounds handed to workers this step",
    "probe/reissued": "probes of a failed worker round issued again",
    "probe/lost": "probes dropped after `probes.max_reissues` failed rounds",
    "probe/worker_restarts": "probe workers restarted after a failure",
    "probe/evicted": "completed probes evicted past the staleness limit before an audit used them",
    "probe/dropped_stale": "unfinished probes dropped past the staleness limit (e.g. after a controller outage)",
    "probe/expired": "completed probes a client forgot past the staleness limit, so far (generic client, TRL, "
                     "AsyncOPD)",
    "probe/audited": "probes read by the audits submitted so far (AsyncOPD)",
    "probe/held": "probes the generic client / TRL callback holds",
    "probe/audits": "audits the generic client / TRL callback / verl adapter submitted so far",
    "probe/copies": "verl adapter: probe copies (a step's prompts again, at the horizon) its generation call carried",
    "probe/offered_complete": "verl adapter: training rows that ended inside the window, accepted as complete probes",
    "probe/audit_s": "seconds the generic client / TRL callback spent auditing so far",
    "probe/audits_rejected": "audits of the generic client / TRL callback refused as non-finite so far",
    "probe/tokens_step": "probe tokens the TRL callback generated this step",
    "probe/gen_s": "seconds the TRL callback spent generating probe continuations this step",
    # audit
    "audit/submitted": "audits submitted to the controller this step",
    "audit/rejected": "audits the controller refused as non-finite (the window stays)",
    "audit/teacher_unavailable": "probe batches closed unaudited because the teacher server did not answer "
                                 "(the window stays; model.teacher_backend: server, or the TRL callback on a served teacher)",
    "audit/released": "probe batches the decision budget held at the run's last step, closed unaudited (no "
                      "later step would use their decision)",
    "audit/skipped": "ready probe batches not audited (`audit.every` / `audit.skip_margin`)",
    "audit/pooled_batches": "probe batches of P audited together as one pooled audit this step (`audit.budget`): "
                            "the others are closed as skipped with `pooled_into` naming the audited one",
    "audit/ready": "probe batches that became ready so far (audit schedule)",
    "audit/audited": "probe batches audited so far (audit schedule)",
    "audit/in_flight": "audits computing on probe workers",
    "audit/id": "the controller's id of the last audit submitted this step",
    "audit/time": "seconds the audit's gradient computation took (where it ran)",
    "audit/probe_tokens": "response tokens of the audited probe batch",
    "audit/staleness_max": "largest staleness of the audited probes",
    "audit/staleness_mean": "mean staleness of the audited probes",
    "audit/weights_version": "the weights version the audit ran under",
    "audit/lag_steps": "learner steps between the audit's weights and its submission (worker audits)",
    "audit/next_window": "the window this audit decided",
    "audit/micro_cos_<c>": "batch-level cosine of the candidate-c prefix gradient with the full gradient",
    "audit/macro_cos_<c>": "mean over probes of the per-probe cosine at candidate c (`audit.macro`)",
    "audit/batch_cos_<c>": "the plain batch cosine at candidate c when `audit.estimator: debiased` reports "
                           "the debiased one as the micro cosine",
    "audit/cos_ci_<k>_<c>": "low / high end of the bootstrap interval of the cosine at candidate c (`audit.ci_level`)",
    "audit/debiased_fallbacks": "candidates where the debiased estimate fell back to the batch cosine",
    "audit/noise_cos_<c>": "what the audit's estimator reads at candidate c when its samples share no signal: "
                           "sqrt(N_w / N_F) for the batch cosine, 0 for the debiased one (needs per-sample "
                           "gradients: `audit.ci_level`, `debiased` or `audit.macro`)",
    "audit/signal_z": "how surely the audited samples share a full-gradient direction (cross-sample sum over its "
                      "standard error with no signal); below `window.signal_z` the audit is unresolved",
    "audit/noise_scale": "the full gradient's noise scale B = tr(Sigma) / |mu|^2 over the samples the decision read "
                         "(absent where they show no mean: B infinite); needs per-sample vectors",
    "audit/effective_dim": "the effective dimension tr(Sigma)^2 / tr(Sigma^2) of the full gradient's noise over "
                           "those samples",
    "audit/unresolved": "1 when the decision's evidence could not resolve the full gradient's signal (signal z "
                        "below `window.signal_z`, or samples below `window.resolve_samples` x B) and the window "
                        "followed `window.unresolved`; 0 when resolved (absent: not judged, no per-sample vectors)",
    "audit/evidence_samples": "probe samples the decision read: this audit's, and earlier ones' with "
                              "`audit.evidence_audits` > 1",
    "audit/evidence_audits": "audits whose samples the decision read (`audit.evidence_audits` > 1)",
    "audit/is_<q>": "percentile q (p50, p90, p99) or the max of the stale-probe importance weight of the audited "
                    "tokens (`probes.is_method`)",
    "audit/is_clipped_frac": "share of audited tokens whose weight was capped or clipped",
    "audit/is_masked_frac": "share of audited tokens masked out by the IS treatment",
    "audit/is_stale_token_frac": "share of audited tokens sampled by older weights than the audit's",
    # drift
    "drift/survival_<k>_at_<c>": "share of probes whose first c tokens all lie in the teacher's top-k",
    "drift/rejections_<k>_at_<c>": "mean count of tokens among the first c outside the teacher's top-k",
    "drift/ppl_<c>": "the teacher's perplexity of the probes' tokens in the segment ending at c",
    # eval
    "eval/accuracy": "mean@k accuracy on the held-out problems",
    "eval/mean_len": "mean response length of the evaluation samples",
    "eval/teacher_kl": "k1 estimate of KL(student || teacher) on the evaluation samples",
    "eval/lines_right": "built-in tasks: mean share of the reference chain lines written right before the first wrong "
                        "one",
    "eval/closing_right": "chain-late tasks: share of responses whose closing line follows from the chain line "
                          "written above it",
    "eval/forced_lines": "built-in tasks: share of the reference chain lines the student predicts right, character "
                         "for character, with every line above it the reference's (teacher forcing; `eval.forced_lines`)",
    "eval/forced_lines@<c>": "the same, of the lines ending in the response tokens after the next shorter candidate "
                             "up to c (the last bin ends at the horizon)",
    # time
    "time/rollout": "seconds generating the step's rollouts",
    "time/teacher": "seconds scoring them with the teacher",
    "time/train": "seconds of the forward, backward and optimizer step",
    "time/probe": "learner-side seconds of offers and probe rounds",
    "time/audit": "learner-side seconds of audits (teacher scoring of the probe batch, drift, submission; the "
                  "whole audit with the inline backend)",
    "time/eval": "seconds evaluating",
    "time/wall": "seconds since the run started",
    # controller
    "controller/degraded": "1 while the remote controller is unreachable and the run trains on the last window",
    "controller/outages": "outages so far",
    "controller/pending": "writes buffered for the controller",
    "controller/replayed": "buffered writes delivered after an outage",
    # async
    "async/version": "the learner's version (updates applied)",
    "async/inference_version": "the weights version the rollout workers hold",
    "async/staleness_mean": "mean learner version minus sampling version of the update's samples",
    "async/staleness_max": "largest such staleness of the update",
    "async/tokens": "response tokens trained on in this update",
    "async/breakpoints": "weight changes inside kept requests (keep-mode syncs) among the update's samples",
    "async/permits_outstanding": "permits held by requests in flight (bounded by (tau + 1) B)",
    "async/throughput_tokens_per_s": "trained response tokens per second after the warm-up updates",
    "async/discarded_items": "samples discarded so far (OAPL: groups of an older inference policy)",
    "async/discarded_tokens": "their response tokens (generated, never trained on)",
    # decision
    "decision/flops_share": "decision FLOPs D over all FLOPs T + D so far (the formula of adwin.audit.budget); "
                            "the budget keeps it at most `audit.budget`, up to the first decision's cost (never delayed)",
    "decision/flops_share_<k>": "the share of all FLOPs so far spent on decision part k (extension, scoring, "
                                "drift, audit)",
    "decision/seconds_share": "measured seconds of the decision parts over those plus the learner's training "
                              "seconds (rollout, teacher, update); reported, never used to gate",
    "decision/learner_share": "the learner's own seconds in decision calls (offers, extension rounds it ran or "
    "waited for, the teacher's scoring of probe batches, drift, audits it ran or waited for) over those plus its "
    "training seconds: what decisions take off the learner's wall (a worker's audit is not in it)",
    "decision/cadence": "steps per decision at the current estimates (budget off: steps per decision so far)",
    "decision/pool": "probes per decision after the first (k batches of P)",
    "decision/pressure": "how many times offering `probes.offers_per_step` every step would exceed the budget",
    "decision/pressure_seconds": "`decision/pressure` in the learner's own decision seconds against its training "
                                 "seconds (0 with `audit.budget_seconds: false`); the pool follows the larger",
    "decision/decisions": "audits run so far (a pooled audit counts once)",
    "decision/in_flight": "probes offered and accepted, not yet audited or released",
    "decision/budget": "`audit.budget` (absent with `audit.budget: null`)",
    "decision/samples_needed": "samples N* a decision needs to resolve the full gradient's signal at the last "
                               "audit's noise scale and effective dimension (adwin.audit.sizing; not with "
                               "`window.unresolved: decide`)",
    "decision/resolvable": "1 when the budget may pool N* over `audit.evidence_audits` audits (`audit.pool_max`, "
                           "half the staleness limit's offers), 0 when it cannot: its audits stay unresolved",
    # pipeline
    "pipeline/overlap": "sum of the stages' busy seconds over the wall: above 1 when stages overlap",
    "pipeline/wall_s": "seconds of the pipeline run measured for the overlap",
    "pipeline/busy_<k>_s": "seconds the stage k (rollout, teacher, train) was busy",
    # oapl
    "oapl/reward_mean": "mean sequence reward of the update's samples",
    "oapl/reward_teacher_mean": "mean teacher part of the reward",
    "oapl/reward_task_mean": "mean task (verifier) part of the reward",
    "oapl/value_mean": "mean group value V* (soft maximum of the group's rewards at beta)",
    "oapl/advantage_abs_mean": "mean |reward - V*|",
    "oapl/residual_rms": "root-mean-square residual of the least-squares fit",
    "oapl/seq_log_ratio_mean": "mean sequence log-ratio log pi_theta - log pi_inf",
    "oapl/seq_log_ratio_abs_mean": "mean |sequence log-ratio|",
    "oapl/groups": "prompt groups in the update",
    "oapl/group_size_mean": "mean samples per group",
}

# f-string keys whose whole tail is computed (generic emitters such as a ``prefix`` argument): the keys they
# produce are checked through the runs instead
_TEMPLATE_ONLY = re.compile(r"/<\w+>|_$|/$")
_NAMES = "|".join(NAMESPACES)
_LITERAL = re.compile(rf"""(?<![\w.])(f?)(["'])((?:{_NAMES})/[A-Za-z0-9_@{{}}.]*)\2""")
_NOT_KEYS = {"rollout/logprob_gap"}  # a key prefix passed as an argument (adwin.backends.logprob_gap)
ROOTS = ("adwin", "controller", "probes", "trainer_adapters")


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A documented key with its ``<x>`` placeholders as a regex of one key."""
    parts = re.split(r"(<\w+>)", pattern)
    return re.compile("".join("[A-Za-z0-9.]+" if p.startswith("<") else re.escape(p) for p in parts) + r"\Z")


def documented(key: str) -> str | None:
    """The documented pattern ``key`` is an instance of, or None."""
    return next((p for p in KEYS if pattern_regex(p).match(key)), None)


def emitted_keys(repo: Path) -> dict[str, set[str]]:
    """Literal metric keys of the source under ``repo`` -> the files writing them. f-string placeholders
    become ``0``; keys whose tail is all computed are left to the runs (``_TEMPLATE_ONLY``)."""
    found: dict[str, set[str]] = {}
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            for m in _LITERAL.finditer(path.read_text()):
                key = re.sub(r"\{[^}]*\}", "<n>", m.group(3)) if m.group(1) else m.group(3)
                if _TEMPLATE_ONLY.search(key) or key.count("/") != 1 or key in _NOT_KEYS:
                    continue
                found.setdefault(key.replace("<n>", "0"), set()).add(str(path.relative_to(repo)))
    return found


def undocumented(keys: Iterable[str]) -> list[str]:
    """The keys no documented pattern covers (a key of an unknown namespace never is)."""
    return sorted({k for k in keys if documented(k) is None})


def render() -> str:
    lines = ["# Metrics glossary", "",
             "Every step logs one flat dict of namespaced keys to `metrics.jsonl`, stdout (`--log-stdout`), wandb and",
             "the controller's telemetry. `<c>` in a key is a candidate window, `<k>` another number the key carries.",
             "Generated from `adwin/runtime/glossary.py` (`python -m adwin.runtime.glossary > docs/metrics.md`); a test",
             "checks that every key the code logs is here.", ""]
    for ns, about in NAMESPACES.items():
        keys = [k for k in KEYS if k.startswith(ns + "/")]
        lines += [f"## `{ns}/`", "", about[0].upper() + about[1:] + ".", "", "| key | meaning |", "|---|---|"]
        lines += [f"| `{k}` | {KEYS[k]} |" for k in keys] + [""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
