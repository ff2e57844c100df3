"""The config reference (docs/config.md), generated from the pydantic models: every field of ``TrainConfig`` with
its type, default, allowed range, description, and which scheduler reads it.

"Read by" comes from the table the config's rules refuse with (``adwin.config.run.SYNC_ONLY``) and the
``asyncopd`` section, which a sync run refuses. ``python -m adwin.config.reference``
prints the page; tests/adwin/test_config_reference.py fails when docs/config.md is out of date.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from adwin.config.run import SYNC_ONLY, TrainConfig


def leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo, type[BaseModel]]]:
    """(dotted name, field, owning section) of every non-section field, in declaration order; a section that may
    be null (``model.lora``) is a row of its own (null: off) followed by its fields."""
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from leaves(ann, f"{prefix}{name}.")
            continue
        yield f"{prefix}{name}", f, model
        optional = _optional_section(ann)
        if optional is not None:
            yield from leaves(optional, f"{prefix}{name}.")


def _optional_section(ann: Any) -> type[BaseModel] | None:
    """``S`` of an annotation ``S | None`` with ``S`` a section model, else None."""
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if type(None) in typing.get_args(ann) and len(args) == 1 and isinstance(args[0], type) \
            and issubclass(args[0], BaseModel):
        return args[0]
    return None


def _type_name(ann: Any) -> str:
    if _optional_section(ann) is not None:
        return "section \\| None"
    args = typing.get_args(ann)
    if args and type(None) not in args and typing.get_origin(ann) in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)  # e.g. list[str] | "all-linear"
    if typing.get_origin(ann) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(ann))
    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    return text or str(ann).replace("typing.", "").replace("NoneType", "None")


def _range(f: FieldInfo) -> str:
    parts = []
    for m in f.metadata:
        if isinstance(m, Ge):
            parts.append(f">= {m.ge}")
        elif isinstance(m, Gt):
            parts.append(f"> {m.gt}")
        elif isinstance(m, Le):
            parts.append(f"<= {m.le}")
        elif isinstance(m, Lt):
            parts.append(f"< {m.lt}")
    return ", ".join(parts)


def _default(f: FieldInfo) -> Any:
    return f.default_factory() if f.default_factory is not None else f.default  # type: ignore[call-arg]


def read_by(dotted: str) -> str:
    """``sync`` for the fields the AsyncOPD scheduler refuses (``SYNC_ONLY``), ``asyncopd`` for its own section."""
    if dotted.startswith("asyncopd."):
        return "asyncopd"
    return "sync" if dotted in SYNC_ONLY else "both"


def _cell(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return f"`{text}`" if text != "" else ""


def render() -> str:
    lines = ["# Config reference", "",
             "Every field of a run's configuration (`adwin.config.TrainConfig`): YAML presets set them by section",
             "(`rollout: {max_response_len: 2048}`), `--set rollout.max_response_len=2048` overrides one. An invalid",
             "value fails at load time, naming the field and its range, before any compute. \"Read by\" says which",
             "`scheduler` uses the field (the other refuses a value other than the default).",
             "Generated from the models' field descriptions by `python -m adwin.config.reference > docs/config.md`.",
             ""]
    section = None
    for dotted, f, owner in leaves(TrainConfig):
        head = dotted.rsplit(".", 1)[0] if "." in dotted else "run"
        if head != section:
            section = head
            doc = " ".join((owner.__doc__ or "").strip().split("\n\n")[0].split()) if head != "run" else ""
            lines += ["", f"## `{head}`" if head != "run" else "## The run", ""]
            if doc and owner is not TrainConfig:
                lines += [doc, ""]
            lines += ["| field | type | default | range | read by | what it does |", "|---|---|---|---|---|---|"]
        desc = (f.description or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{dotted}` | {_type_name(f.annotation)} | {_cell(_default(f))} | {_range(f)} | "
                     f"{read_by(dotted)} | {desc} |")
    return "\n".join(lines).replace("\n\n\n", "\n\n").rstrip() + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
