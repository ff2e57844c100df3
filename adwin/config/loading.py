"""Where a run's configuration comes from: the YAML presets shipped inside the package (``configs/`` in the
repository, ``adwin.configs`` once installed), a YAML file the user names, or a run folder's
``config.json``; plus the dotted overrides of ``--set`` and the CLI's window-policy shorthand.

``adwin train`` reads the same preset from any working folder (docs/decisions.md, "Config presets").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from adwin.config.run import TrainConfig
from adwin.policies.registry import is_audited, parse_policy_spec

log = logging.getLogger(__name__)

PRESET_PACKAGE = "adwin.configs"  # pyproject maps it to the repository's configs/ folder
DEFAULT_PRESET = "default"
PRESET_SUFFIX = ".yaml"


class UnknownPreset(ValueError):
    """``--config`` named neither a shipped preset nor an existing file; the message lists the presets."""


@dataclass(frozen=True)
class ConfigSource:
    """The YAML a run's configuration was read from (``None``: pydantic defaults only)."""

    path: Path | None
    preset: str | None = None  # the shipped preset's name, when it is one

    def describe(self) -> str:
        if self.path is None:
            return "built-in defaults (no config file)"
        return f"preset {self.preset!r} ({self.path})" if self.preset else str(self.path)


def preset_names() -> tuple[str, ...]:
    """Names of the presets shipped with the package, sorted (``default``, ``fixed``, ...)."""
    files = resources.files(PRESET_PACKAGE)
    return tuple(sorted(f.name[: -len(PRESET_SUFFIX)] for f in files.iterdir() if f.name.endswith(PRESET_SUFFIX)))


def preset_path(name: str) -> Path:
    """The file of the shipped preset ``name``; ``UnknownPreset`` listing the presets otherwise."""
    if name not in preset_names():
        raise _unknown(name)
    return Path(str(resources.files(PRESET_PACKAGE).joinpath(name + PRESET_SUFFIX)))


def resolve_config(spec: str | Path | None) -> ConfigSource:
    """What ``--config`` names: nothing (the ``default`` preset), a preset's name, or a YAML path.

    A path that does not exist from the working folder but reads ``configs/NAME.yaml`` (as the presets'
    own header commands do) is the shipped preset ``NAME``: the same file, reached from any folder.
    """
    if spec is None:
        return ConfigSource(preset_path(DEFAULT_PRESET), DEFAULT_PRESET)
    text = str(spec)
    if text in preset_names():
        return ConfigSource(preset_path(text), text)
    path = Path(text)
    if path.is_file():  # the repository's configs/NAME.yaml is the shipped preset NAME itself
        shipped = path.stem in preset_names() and path.resolve() == preset_path(path.stem).resolve()
        return ConfigSource(path.resolve(), path.stem if shipped else None)
    if path.parent.name == "configs" and path.suffix == PRESET_SUFFIX and path.stem in preset_names():
        return ConfigSource(preset_path(path.stem), path.stem)
    raise _unknown(text)


def _unknown(spec: str) -> UnknownPreset:
    return UnknownPreset(f"--config {spec!r}: no such preset or file; presets: {', '.join(preset_names())} "
                         "(or a path to a YAML file)")


def default_config_path() -> Path:
    """The shipped ``default`` preset (what ``adwin train`` and the bench commands read without --config)."""
    return preset_path(DEFAULT_PRESET)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None, *,
                world: int = 1) -> TrainConfig:
    """Load a YAML file (or defaults) and apply dotted overrides like ``{"window.threshold": 0.8}``.

    ``world`` > 1 (a data-parallel run): a probing run whose file and overrides name no ``probes.backend`` (or
    ``auto``) extends probes on the ranks themselves (``inline``, the one backend that works with several ranks; logged).
    It is chosen before validation, so the rules that need it (``rollout.seeding: per_sample``) see it. A
    backend that is named is kept, and ``check_data_parallel`` refuses one that cannot work, naming the fix.
    """
    data = apply_overrides(_read(path), overrides or {})
    probes = data.get("probes", {})
    if world > 1 and isinstance(probes, dict) and probes.get("backend", "auto") == "auto":
        try:
            fitted = TrainConfig.model_validate(data | {"probes": probes | {"backend": "inline"}})
        except ValueError:  # invalid either way: the config as given says why
            fitted = None
        if fitted is not None and fitted.probing:
            log.info("probes.backend: inline (none named; a data-parallel run extends probes on its %d ranks, "
                     "the thread and ray backends work with one process only)", world)
            return fitted
    return TrainConfig.model_validate(data)


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set each dotted override (``{"window.threshold": 0.8}``) in the nested mapping ``data``, in place, and
    return it; a missing section is created, a dotted path through a value that is not a section is refused."""
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):  # e.g. ``rollout: 5`` and then ``rollout.top_p``
                raise ValueError(f"{dotted}: {'.'.join(parents[: i + 1])} is not a config section (got {node!r})")
        node[leaf] = value
    return data


def _read(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    text = Path(path).read_text()
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:  # one line naming the file and line, not the parser's multi-line dump
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', None) or e})") from e
    if loaded is not None and not isinstance(loaded, dict):
        raise ValueError(f"{path}: top level must be a mapping of config sections")
    return loaded or {}


def load_source(spec: str | Path | None, overrides: dict[str, Any] | None = None, *,
                world: int = 1) -> tuple[TrainConfig, ConfigSource]:
    """``resolve_config`` then ``load_config``, logging which file the run uses."""
    source = resolve_config(spec)
    cfg = load_config(source.path, overrides, world=world)
    log.info("config: %s", source.describe())
    return cfg, source


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as dotted overrides, each value parsed as YAML.

    New ``window.candidates`` without a ``window.initial`` also reset the preset's initial window to
    ``None`` (the largest new candidate): the preset's initial window belongs to the preset's candidates.
    A ``data.path`` without a ``data.task`` also sets ``data.task: jsonl``: a prompt file given on the command line
    is the one to train on, whatever task the preset names.
    """
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    if "window.candidates" in overrides:
        overrides.setdefault("window.initial", None)
    if overrides.get("data.path") is not None:
        overrides.setdefault("data.task", "jsonl")
    return overrides


def policy_overrides(name: str, **fields: Any) -> dict[str, Any]:
    """Dotted overrides that switch the window policy to ``name`` with its ``fields``. A policy that does not
    audit also unsets ``window.confidence``: a preset or base config that turns it on for ADWIN must not
    block a switch to ``full`` or ``fixed`` (setting both by hand is still refused, naming the field)."""
    out: dict[str, Any] = {"window.policy": name} | {f"window.{k}": v for k, v in fields.items()}
    if not is_audited(name):
        out["window.confidence"] = False
    return out


def apply_policy_spec(overrides: dict[str, Any], spec: str) -> dict[str, Any]:
    """Turn ``--window-policy fixed:64`` into dotted overrides for the window section."""
    fields = parse_policy_spec(spec)
    overrides |= policy_overrides(fields.pop("name"), **fields)
    return overrides
