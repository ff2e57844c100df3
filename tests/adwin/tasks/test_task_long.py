"""The long-horizon tasks (chain-long, chain-late-long): solutions against an independent implementation,
the verifiers refuse planted mistakes, responses of 510-2,046 tokens inside the horizon, the models cover
it, the closing skill is absent from the student's SFT data (and weights: test_task_suite.py), and the cache fingerprint follows the rule."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from task_reference import reference_response

from adwin.tasks import assets, suite
from adwin.tasks.chain import MOD
from adwin.tasks.long import LONG_MAX_STEPS, LONG_MIN_STEPS, SFT_SHORT_MAX, LongExcerpt, LongProblem
from adwin.tasks.noise import corrupt_solution
from adwin.tasks.phases import phase_spans
from adwin.tasks.sft import encode_example
from adwin.tasks.suite import get_task
from adwin.tasks.tokenizer import build_tokenizer

LONG_TASKS = ("chain-long", "chain-late-long")


@pytest.mark.parametrize("name", LONG_TASKS)
def test_solutions_and_answers_match_an_independent_implementation(name: str) -> None:
    task = get_task(name)
    for split in ("train", "eval"):
        for p in task.problems(150, seed=1, split=split):
            want = reference_response(p.route, p.x, p.a, p.b, p.n, counter_digits=3, closing=name == "chain-late-long")
            assert task.solution(p) == want
            assert task.answer(p) == want.rsplit("=", 1)[1]
            assert task.verify(p.prompt, want)


@pytest.mark.parametrize("name", LONG_TASKS)
def test_problems_are_deterministic_task_length_and_both_routes(name: str) -> None:
    task = get_task(name)
    first = task.samples(300, seed=5, split="eval")
    assert first == task.samples(300, seed=5, split="eval")
    assert first != task.samples(300, seed=6, split="eval")
    problems = task.problems(300, seed=5, split="eval")
    assert all(LONG_MIN_STEPS <= p.n <= LONG_MAX_STEPS for p in problems)
    assert {p.route for p in problems} == {"muladd", "submul"}
    assert max(p.n for p in problems) - min(p.n for p in problems) > 80  # the whole range, not one length


@pytest.mark.parametrize("name", LONG_TASKS)
def test_responses_are_510_to_2046_tokens_and_fit_the_horizon_and_the_models(name: str) -> None:
    task, tok = get_task(name), build_tokenizer()
    lengths = [len(tok(task.solution(p), add_special_tokens=False)["input_ids"]) + 1  # + <eos>
               for p in task.problems(400, seed=0, split="eval")]
    assert min(lengths) >= 500 and max(lengths) <= task.horizon == 2048
    assert max(lengths) > 1800  # long chains are drawn, not only the short end
    longest = LongProblem("submul", 9, 9, 9, LONG_MAX_STEPS)
    assert len(tok(task.solution(longest), add_special_tokens=False)["input_ids"]) + 1 <= task.horizon
    assert all(c < task.horizon for c in task.candidates) and list(task.candidates) == sorted(task.candidates)
    prompt = len(tok(longest.prompt)["input_ids"])
    for profile in ("default", "tiny"):
        assert task.profile(profile).model.max_positions >= prompt + task.horizon


@pytest.mark.parametrize("name", LONG_TASKS)
def test_verifier_refuses_planted_mistakes(name: str) -> None:
    task = get_task(name)
    p = LongProblem("muladd", 4, 3, 5, 40)
    good = task.solution(p)
    assert task.verify(p.prompt, good)
    lines = good.split("\n")
    mid = lines[20]  # "020:x*3=p+5=q"
    wrong_q = mid[:-1] + str((int(mid[-1]) + 1) % MOD)
    bad = [
        "\n".join(lines[:20] + [wrong_q] + lines[21:]),  # a wrong result, the rest as written before
        "\n".join(lines[:20] + lines[21:]),  # a line left out
        "\n".join(lines[:20] + ["099" + mid[3:]] + lines[21:]),  # a wrong counter
        "\n".join(line[1:] if line[0] == "0" else line for line in lines),  # the short task's 2-digit counter
        good.rsplit("=", 1)[0] + f"={(int(good[-1]) + 1) % MOD}",  # a wrong final answer
        good.replace("\nans=", "\nans=\n"),
    ]
    for text in bad:
        assert not task.verify(p.prompt, text)


@pytest.mark.parametrize("seed", range(3))
def test_planted_mistakes_use_the_wide_counter_and_keep_the_response_inside_the_horizon(seed: int) -> None:
    rng = random.Random(seed)
    task = get_task("chain-long")
    planted = 0
    for p in task.problems(40, seed=seed):
        text, trained = corrupt_solution(p, rng, line_rate=0.2)
        lines = text.split("\n")
        assert all(line[3] == ":" and line[:3].isdigit() for line in lines[:-1])
        assert lines[-2].startswith("001:") and len(lines) - 1 <= LONG_MAX_STEPS
        planted += trained.count(False)
    assert planted > 0


def test_sft_curriculum_mixes_short_and_task_length_chains_deterministically() -> None:
    task = get_task("chain-long")
    problems = task.sft_problems(2000, seed=0)
    assert problems == task.sft_problems(2000, seed=0)
    short = sum(p.n <= SFT_SHORT_MAX for p in problems)
    excerpts = [p for p in problems if isinstance(p, LongExcerpt)]
    whole = [p for p in problems if p.n >= LONG_MIN_STEPS and not isinstance(p, LongExcerpt)]
    assert 0.3 < short / len(problems) < 0.5 and 0.35 < len(excerpts) / len(problems) < 0.55
    assert len(whole) > 100  # task-length chains are trained on whole
    assert all(p.n >= LONG_MIN_STEPS and 1 <= p.kept <= SFT_SHORT_MAX for p in excerpts)
    # the excerpts' counters reach every tens digit of the long chains, and the hundreds' borrow (100 -> 099)
    tens = {c // 10 for p in excerpts for c in range(p.n - p.kept + 1, p.n + 1)}
    assert tens == set(range(LONG_MAX_STEPS // 10 + 1))
    assert any(p.n - p.kept < 100 <= p.n for p in excerpts)
    assert all(p.split == "train" for p in problems)
    eval_keys = {p.key for p in task.problems(500, seed=0, split="eval")}
    assert not eval_keys & {p.key for p in problems}


def _labels(task_name: str, problems: list, student_phase: bool) -> list[list[int]]:
    tok = build_tokenizer()
    task, rng = get_task(task_name), random.Random(0)
    out = []
    for p in problems:
        _, labels = encode_example(tok, p, rng, 0.0, task, student_phase)
        out.append(labels[len(tok(p.prompt)["input_ids"]):])
    return out


def test_closing_digits_are_absent_from_the_students_sft_data() -> None:
    task = get_task("chain-late-long")
    problems = [p for p in task.sft_problems(120, seed=0) if not isinstance(p, LongExcerpt)]  # whole chains
    student, teacher = _labels(task.name, problems, True), _labels(task.name, problems, False)
    for p, s_row, t_row in zip(problems, student, teacher, strict=True):
        text = task.solution(p)
        closing = text.rindex("fin:")
        assert phase_spans(text)["late"] == (closing, len(text))
        assert all(v != -100 for v in s_row[:closing])  # every chain line is trained
        assert [v == -100 for v in s_row[closing:-1]] == [c.isdigit() for c in text[closing:]]
        assert s_row[-1] != -100 and all(v != -100 for v in t_row)


@pytest.mark.parametrize("name", LONG_TASKS)
def test_cache_fingerprint_changes_with_the_rule_and_the_format(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = assets.profile_fingerprint("default", name)
    assert before != assets.profile_fingerprint("default", "chain")
    assert assets.profile_fingerprint("default", "chain-long") != assets.profile_fingerprint("default", "chain-late-long")
    monkeypatch.setitem(suite.TASKS, name, dataclasses.replace(suite.TASKS[name], rule_version=99))
    bumped = assets.profile_fingerprint("default", name)
    assert bumped != before
    fields = suite.TASKS[name].fingerprint_fields
    monkeypatch.setitem(suite.TASKS, name, dataclasses.replace(suite.TASKS[name], fingerprint_fields=(*fields, 1)))
    assert assets.profile_fingerprint("default", name) != bumped


def test_tiny_prepare_of_a_long_task_records_its_horizon_and_ladder(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prepared = assets.ensure_prepared(home=tmp_path, profile="tiny", task="chain-late-long", threads=1)
    assert prepared.root.name == "chain-late-long-tiny-seed0"
    meta = json.loads((prepared.root / "meta.json").read_text())
    task = get_task("chain-late-long")
    assert meta["format"]["max_response_tokens"] == task.horizon
    assert meta["format"]["default_candidates"] == list(task.candidates)
    assert meta["format"]["line_chars"] == 14 and meta["format"]["min_steps"] == LONG_MIN_STEPS
    assert meta["model"]["max_positions"] == task.profile("tiny").model.max_positions
    model = AutoModelForCausalLM.from_pretrained(str(prepared.student_path))
    assert model.config.max_position_embeddings >= task.horizon
    tokenizer = AutoTokenizer.from_pretrained(str(prepared.tokenizer_path))  # no over-length warning on a response
    assert tokenizer.model_max_length == model.config.max_position_embeddings
    assert assets.is_prepared(prepared.root, "tiny", "chain-late-long")
    calibration = meta["teacher_calibration"]  # the teacher's logit scale, fit on train problems
    assert calibration["problems"] == task.profile("tiny").teacher_calibration
    assert calibration["nll_after"] <= calibration["nll_before"]
    # the long students' greedy rollouts never stop: only their T = 1 accuracy is measured, the teacher's both
    assert meta["measured"]["student_accuracy_greedy"] is None and meta["eval"]["student"]["greedy"] is None
    assert meta["measured"]["teacher_accuracy_greedy"] is not None and meta["measured"]["student_accuracy_t1"] is not None
    from adwin.tasks.prepare import _summary

    assert "student accuracy: greedy not measured" in _summary(meta)
    assert meta["targets"] == task.profile("tiny").targets  # what targets_met was judged against


@pytest.mark.parametrize("name", LONG_TASKS)
def test_long_preset_carries_the_tasks_horizon_and_ladder_and_fits_their_models(name: str) -> None:
    from adwin.config import load_config
    from adwin.sampling.data import check_context

    preset = Path(__file__).resolve().parents[3] / "configs" / "long.yaml"
    cfg = load_config(preset, {"data.builtin_task": name})
    task = get_task(name)
    assert cfg.data.builtin_task == name
    assert cfg.rollout.max_response_len == task.horizon and cfg.window.candidates == list(task.candidates)
    batch = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    assert cfg.probes.batch_size * 16 == batch  # P = 1/16 of a training batch, as in the paper
    for profile in ("default", "tiny"):
        check_context(cfg.data.max_prompt_len, cfg.rollout.max_response_len, task.profile(profile).model.max_positions)


def test_long_prompts_write_n_with_three_digits_so_every_prompt_has_one_length() -> None:
    from adwin.tasks.chain import parse_prompt

    task = get_task("chain-long")
    problems = [*task.problems(200, seed=0, split="eval"), *task.sft_problems(200, seed=0)]
    assert min(p.n for p in problems) < 10 and max(p.n for p in problems) >= 100  # one, two and three digits
    for p in problems:
        assert p.prompt.endswith(f" n={p.n:03d}\n")
        assert p.prompt[p.prompt.index("n=") + 2:-1] == task.solution(p)[:3]  # the first counter copies n verbatim
        assert parse_prompt(p.prompt, LongProblem).key == p.key  # an excerpt's prompt is its whole chain's
    assert len({len(p.prompt) for p in problems}) == 1


def test_length_grouping_over_the_segment_keeps_every_sample_once_and_pads_less() -> None:
    from adwin.tasks.sft import encode_examples, make_batches

    task, tok = get_task("chain-long"), build_tokenizer()
    assert task.sft_group_all
    problems = task.sft_problems(16 * 24, seed=3)
    whole = make_batches(tok, problems, 16, seed=3, noise_line_rate=0.05, task=task, group_batches=None)
    chunked = make_batches(tok, problems, 16, seed=3, noise_line_rate=0.05, task=task, group_batches=8)
    want = sorted((tuple(ids), tuple(labels)) for ids, labels in
                  encode_examples(tok, problems, random.Random("adwin-noise:3"), 0.05, task))
    for batches in (whole, chunked):
        rows = []
        for input_ids, mask, labels in batches:
            for r in range(input_ids.shape[0]):
                n = int(mask[r].sum())
                rows.append((tuple(input_ids[r, :n].tolist()), tuple(labels[r, :n].tolist())))
        assert sorted(rows) == want
    padded = [sum(b[0].numel() for b in batches) for batches in (whole, chunked)]
    real = sum(len(ids) for ids, _ in want)
    assert real <= padded[0] < padded[1]


@pytest.fixture(scope="module")
def chain_tiny_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("warm_home")
    assets.ensure_prepared(home=home, profile="tiny", task="chain", threads=1)
    return home


def test_warm_start_loads_the_cached_chain_teacher_and_prepares_it_first_when_missing(chain_tiny_home: Path,
                                                                                     tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from adwin.tasks.build import load_warm_start, sft_recipe

    task = get_task("chain-long")
    spec = task.profile("tiny")
    assert spec.warm is not None and spec.warm.source == "chain"
    source = assets.warm_source(chain_tiny_home, "tiny", 0, "chain-long")
    assert source == assets.assets_root(chain_tiny_home, "tiny", 0, "chain") / "teacher"
    assert assets.warm_source(tmp_path, "tiny", 0, "chain-long") is None  # nothing cached: from scratch
    assert assets.warm_source(chain_tiny_home, "tiny", 1, "chain-long") is None  # another seed's cache is not it
    assert sft_recipe(task, "tiny", source) == (spec.warm.schedule, task.student_step(spec.warm.student_step,
                                                                                      spec.warm.schedule.steps))
    assert sft_recipe(task, "tiny", None) == (spec.schedule, task.student_step(spec.student_step, spec.schedule.steps))

    tok = build_tokenizer()
    model = spec.model.build(len(tok), tok, seed=0)
    load_warm_start(model, source)
    teacher = AutoModelForCausalLM.from_pretrained(str(source)).state_dict()
    assert all(torch.equal(v, teacher[k]) for k, v in model.state_dict().items())

    warm = assets.ensure_prepared(home=chain_tiny_home, profile="tiny", task="chain-long", threads=1)
    assert warm.meta["sft"]["warm_from"] == str(source) and warm.meta["sft"]["steps"] == spec.warm.schedule.steps
    # nothing cached: chain is prepared first, then chain-long from it (not the from-scratch recipe)
    cold = assets.ensure_prepared(home=tmp_path, profile="tiny", task="chain-long", threads=1)
    assert cold.meta["sft"]["warm_from"] == str(assets.assets_root(tmp_path, "tiny", 0, "chain") / "teacher")


def test_warm_start_is_refused_when_the_source_model_differs(chain_tiny_home: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from adwin.tasks import profiles

    spec = profiles.LONG_PROFILE_SPECS["tiny"]
    wider = dataclasses.replace(spec, model=dataclasses.replace(spec.model, hidden_size=spec.model.hidden_size * 2))
    monkeypatch.setitem(profiles.LONG_PROFILE_SPECS, "tiny", wider)
    assert assets.warm_source(chain_tiny_home, "tiny", 0, "chain-long") is None


@pytest.mark.parametrize("name", LONG_TASKS)
def test_cache_fingerprint_changes_with_the_warm_start_recipe(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from adwin.tasks import profiles

    before = assets.profile_fingerprint("default", name)
    specs = get_task(name).profiles
    assert specs is (profiles.LATE_LONG_PROFILE_SPECS if name == "chain-late-long" else profiles.LONG_PROFILE_SPECS)
    spec = specs["default"]
    assert spec.warm is not None
    longer = dataclasses.replace(spec.warm, schedule=dataclasses.replace(spec.warm.schedule,
                                                                         steps=spec.warm.schedule.steps + 1))
    monkeypatch.setitem(specs, "default", dataclasses.replace(spec, warm=longer))
    assert assets.profile_fingerprint("default", name) != before
    assert "prompt-n-zero-padded" in get_task(name).fingerprint_fields


@pytest.mark.parametrize("name", [t for t in suite.TASK_NAMES if t not in LONG_TASKS])
@pytest.mark.parametrize("profile", ["default", "tiny"])
def test_only_the_long_tasks_warm_start(name: str, profile: str) -> None:
    """The short tasks train from scratch: a warm start from chain would hand chain-drift and chain-late a
    teacher they must not inherit, and chain itself a copy of its own cache."""
    assert get_task(name).profile(profile).warm is None


@pytest.mark.parametrize("name", ["chain-long", "chain-late-long"])
def test_an_excerpt_is_its_chains_first_lines_with_the_eos_untrained(name: str) -> None:
    task, tok = get_task(name), build_tokenizer()
    excerpt = LongExcerpt("muladd", 8, 7, 7, 95, kept=10)
    whole = LongProblem("muladd", 8, 7, 7, 95)
    assert excerpt.split == whole.split and excerpt.prompt == whole.prompt
    text, trained = task.write(excerpt, random.Random(0), 0.0, False)
    assert text == task.solution(whole)[: 10 * LongProblem.line_chars()] and text.startswith("095:")
    assert all(trained[:-1]) and len(trained) == len(text) + 1 and trained[-1] is False  # the last flag: the EOS
    ids, labels = encode_example(tok, excerpt, random.Random(0), 0.0, task)
    assert ids[-1] == tok.eos_token_id and labels[-1] == -100  # the chain goes on: no stop is taught here
    with pytest.raises(ValueError, match="excerpt"):
        LongExcerpt("muladd", 8, 7, 7, 95, kept=95)


def test_an_excerpt_whose_planted_counter_ends_the_chain_early_stays_whole() -> None:
    task, ended = get_task("chain-long"), 0
    for seed in range(100):  # a planted counter is followed: a jump down can end the chain within the kept lines
        text, trained = task.write(LongExcerpt("muladd", 8, 7, 7, 40, kept=30), random.Random(seed), 0.5, False)
        if "ans=" in text:
            ended += 1
            assert text.count("\n") < 30 and len(trained) == len(text)  # whole: its answer and EOS trained
        else:
            assert text.count("\n") == 30 and text.endswith("\n") and trained[-1] is False
    assert ended > 0


def test_chain_late_long_trains_its_student_from_chain_long_and_its_teacher_from_chain_late(tmp_path: Path) -> None:
    """The student must write the chain lines at length and lack only the closing rule (chain-long's teacher never
    saw a closing line); the teacher starts from chain-late's teacher, which knows the rule, in a run of its own."""
    import torch
    from transformers import AutoModelForCausalLM

    warm = get_task("chain-late-long").profile("default").warm
    assert warm is not None and (warm.source, warm.teacher_source) == ("chain-long", "chain-late")
    home = tmp_path / "home"
    two = assets.ensure_prepared(home=home, profile="tiny", task="chain-late-long", threads=1)  # its sources first
    assert all(assets.is_prepared(assets.assets_root(home, "tiny", 0, t), "tiny", t)
               for t in ("chain", "chain-long", "chain-late"))
    root = lambda task: assets.assets_root(home, "tiny", 0, task)  # noqa: E731
    assert two.meta["sft"]["warm_from"] == str(root("chain-long") / "teacher")
    assert two.meta["sft"]["teacher_warm_from"] == str(root("chain-late") / "teacher")
    assert two.meta["sft"]["teacher_schedule"]["closing_weight"] == 2.0  # the tiny recipe weighs it too
    student, teacher = (AutoModelForCausalLM.from_pretrained(str(p)).state_dict()
                        for p in (two.student_path, two.teacher_paths["muladd"]))
    assert not all(torch.equal(v, teacher[k]) for k, v in student.items())


@pytest.mark.parametrize("name", LONG_TASKS)
def test_cache_fingerprint_changes_with_the_teacher_calibration_and_only_the_long_tasks_calibrate(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = get_task(name).profiles
    assert specs["default"].teacher_calibration > 0
    before = assets.profile_fingerprint("default", name)
    monkeypatch.setitem(specs, "default", dataclasses.replace(specs["default"], teacher_calibration=0))
    assert assets.profile_fingerprint("default", name) != before
    assert all(get_task(t).profile(p).teacher_calibration == 0
               for t in suite.TASK_NAMES if t not in LONG_TASKS for p in ("default", "tiny"))


def test_chain_late_long_weights_its_teachers_closing_line_and_unweighted_caches_keep_their_fingerprints(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The teacher's closing line weighs 2 (docs/task.md), the student's run is unweighted; a schedule at
    weight 1 leaves the fingerprint it had before the field, so the other tasks' caches stay valid."""
    specs = get_task("chain-late-long").profiles
    warm = specs["default"].warm
    assert warm is not None and warm.teacher_schedule is not None
    assert (warm.teacher_schedule.closing_weight, warm.schedule.closing_weight) == (2.0, 1.0)
    before = assets.profile_fingerprint("default", "chain-late-long")
    unweighted = dataclasses.replace(warm, teacher_schedule=dataclasses.replace(warm.teacher_schedule, closing_weight=1.0))
    monkeypatch.setitem(specs, "default", dataclasses.replace(specs["default"], warm=unweighted))
    assert assets.profile_fingerprint("default", "chain-late-long") != before
    # the fingerprints of the caches prepared before closing_weight and student_greedy_eval existed
    assert {t: assets.profile_fingerprint("default", t) for t in ("chain", "chain-drift", "chain-late", "chain-long")} == {
        "chain": "e3a06ce3c573fc60", "chain-drift": "d604461e20b9f1ec", "chain-late": "94edba3794ffffbe",
        "chain-long": "7e2ff64c15e6712f"}


def test_the_long_tasks_are_judged_by_their_own_targets_and_an_unknown_target_is_refused() -> None:
    from adwin.tasks.profiles import TARGETS

    assert get_task("chain-long").profile("default").targets["teacher_accuracy_min"] == 0.8
    assert get_task("chain-late-long").profile("default").targets["teacher_accuracy_min"] == 0.7
    assert get_task("chain").profile("default").targets == TARGETS
    assert all(get_task(t).profile("default").targets["wall_seconds_max"] == 300.0 for t in suite.TASK_NAMES)
    with pytest.raises(ValueError, match="teacher_acc"):
        dataclasses.replace(get_task("chain").profile("tiny"), target_overrides=(("teacher_acc", 0.5),))
