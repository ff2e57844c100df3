from __future__ import annotations

import json
from pathlib import Path

import pytest

from adwin.sampling.data import (
    DataError,
    Prompt,
    PromptStream,
    check_routes,
    load_jsonl,
    match_answer,
)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_loads_prompt_answer_and_route(tmp_path: Path) -> None:
    p = _write(tmp_path / "d.jsonl", [
        json.dumps({"prompt": "1+1=", "answer": 2, "expert": "math"}),
        "",
        json.dumps({"prompt": "hi", "id": "x7"}),
    ])
    rows = load_jsonl(p, route_key="expert")
    assert rows[0] == Prompt(id="d-1", prompt="1+1=", answer="2", route="math")
    assert rows[1] == Prompt(id="x7", prompt="hi", answer=None, route="default")


def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    p = _write(tmp_path / "bad.jsonl", [json.dumps({"prompt": "ok"}), "{not json", json.dumps({"prompt": "x"})])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: invalid JSON"):
        load_jsonl(p)


@pytest.mark.parametrize(("record", "field"), [
    ({"answer": "3"}, "'prompt'"),
    ({"prompt": ""}, "'prompt'"),
    ({"prompt": "a", "answer": [1]}, "'answer'"),
    ({"prompt": "a", "teacher": 5}, "'teacher'"),
])
def test_bad_field_is_named_with_line_number(tmp_path: Path, record: dict, field: str) -> None:
    p = _write(tmp_path / "f.jsonl", [json.dumps({"prompt": "fine"}), json.dumps(record)])
    with pytest.raises(DataError, match=rf"f\.jsonl:2: field {field}"):
        load_jsonl(p)


def test_non_object_line_and_empty_file_fail(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=":1: each line must be a JSON object"):
        load_jsonl(_write(tmp_path / "l.jsonl", ["[1, 2]"]))
    with pytest.raises(DataError, match="no prompts"):
        load_jsonl(_write(tmp_path / "e.jsonl", [""]))
    with pytest.raises(FileNotFoundError):
        load_jsonl(tmp_path / "missing.jsonl")


def test_unknown_teacher_key_is_named() -> None:
    prompts = [Prompt("a", "p", route="math"), Prompt("b", "q", route="poetry")]
    with pytest.raises(DataError, match="'poetry'"):
        check_routes(prompts, ["math", "code"])
    check_routes(prompts, ["default"])  # a single teacher scores every route


def test_prompt_stream_is_seeded_and_covers_each_epoch() -> None:
    prompts = [Prompt(str(i), f"p{i}") for i in range(5)]
    a, b = PromptStream(prompts, seed=3), PromptStream(prompts, seed=3)
    first = a.next_batch(5)
    assert sorted(p.id for p in first) == [str(i) for i in range(5)]
    assert first == b.next_batch(5)
    assert len(a.next_batch(7)) == 7 and a.epoch == 3
    with pytest.raises(DataError):
        PromptStream([])


def test_match_answer_uses_last_number_or_text() -> None:
    assert match_answer("so 3 + 4 = 7", "7")
    assert not match_answer("7 or maybe 8", "7")
    assert match_answer("x = 2.50", "2.5")
    assert match_answer("The capital is Paris.", "paris")
    assert not match_answer("anything", " ")
