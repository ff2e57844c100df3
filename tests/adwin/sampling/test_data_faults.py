"""Bad prompt data: each fault has one defined behaviour (docs/reliability.md), before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.loop.parts import load_parts
from adwin.sampling.data import DataError, Prompt, check_context, check_routes, load_jsonl
from adwin.sampling.rollout import encode_prompts


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("line", "message"), [
    ('{"prompt": "a"', "invalid JSON"),
    ('"just a string"', "must be a JSON object"),
    ('{"prompt": "   "}', "field 'prompt'"),
    ('{"prompt": null}', "field 'prompt'"),
    ('{"prompt": "a", "teacher": ""}', "field 'teacher'"),
])
def test_each_malformed_line_fails_with_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    p = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": "ok"}), "", line, json.dumps({"prompt": "later"})])
    with pytest.raises(DataError, match=rf"d\.jsonl:3: .*{message}"):
        load_jsonl(p)


def test_unknown_teacher_key_names_the_sample_line_and_the_configured_teachers(tmp_path: Path) -> None:
    p = _write(tmp_path / "r.jsonl", [json.dumps({"prompt": "x", "teacher": "math"}),
                                      json.dumps({"prompt": "y", "teacher": "poetry", "id": "q7"})])
    with pytest.raises(DataError, match=r"'q7' \(.*r\.jsonl:2\) routes to teacher 'poetry'.*\['code', 'math'\]"):
        check_routes(load_jsonl(p), ["math", "code"])


def test_unknown_teacher_key_stops_the_run_before_training(tmp_path: Path) -> None:
    ov = tiny_overrides(tmp_path)
    ov["model.teachers"] = {"a": ov["model.teachers"]["default"], "b": ov["model.teachers"]["default"]}
    with pytest.raises(DataError, match="routes to teacher 'default'"):
        load_parts(load_config(None, ov))
    assert not (tmp_path / "runs").exists()


def test_prompt_longer_than_max_prompt_len_keeps_its_last_tokens(tmp_path: Path) -> None:
    from adwin.tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    full = encode_prompts(tok, ["1+2+3+4+5+6+7="], 10_000)[0]
    cut = encode_prompts(tok, ["1+2+3+4+5+6+7="], 5)[0]
    assert len(full) > 5 and cut == full[-5:]


def test_prompt_plus_response_beyond_the_student_context_fails_naming_both_fields(tmp_path: Path) -> None:
    check_context(128, 128, 256)
    check_context(10_000, 10_000, None)  # unknown context: not checked
    with pytest.raises(DataError, match=r"data\.max_prompt_len \(200\) \+ rollout\.max_response_len \(100\)"):
        check_context(200, 100, 256)
    ov = tiny_overrides(tmp_path, **{"data.max_prompt_len": 250, "rollout.max_response_len": 16})
    with pytest.raises(DataError, match="exceeds the student's context of 256"):
        load_parts(load_config(None, ov))


def test_prompt_equality_ignores_its_source_location() -> None:
    assert Prompt("a", "p", source="f:1") == Prompt("a", "p", source="g:9")
