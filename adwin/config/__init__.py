"""Typed run configuration: ``TrainConfig`` and its sections (pydantic), the rules across sections, and the
YAML presets shipped with the package (``configs/`` in the repository). Every invalid value fails at load
time naming the field and its allowed range.

Modules, bottom first (each imports only those before it): ``base`` (strict models, importance-ratio
fields), ``oapl`` and ``loss`` (the ``loss`` section), ``sections`` (the other sections), ``run``
(``TrainConfig`` and the cross-section rules), ``loading`` (presets, YAML, ``--set`` overrides). Its layer
sits above the math (objectives, audit, policies, sampling) and below the controller (``LAYERS`` in
tests/test_packaging.py).
"""

from adwin.config.base import ISHighField, ISLowField, ISMethodField, _Strict, check_is_bounds
from adwin.config.loading import (
    DEFAULT_PRESET,
    ConfigSource,
    UnknownPreset,
    apply_overrides,
    apply_policy_spec,
    default_config_path,
    load_config,
    load_source,
    parse_set,
    policy_overrides,
    preset_names,
    preset_path,
    resolve_config,
)
from adwin.config.loss import LossConfig
from adwin.config.oapl import OAPLSection
from adwin.config.run import TrainConfig, check_engines, check_oapl, lag_of, vllm_engine_count
from adwin.config.sections import (
    DEFAULT_VLLM_GPU_MEMORY,
    MAX_VLLM_GPU_MEMORY,
    AsyncOPDSection,
    AuditConfig,
    ControllerSection,
    DataConfig,
    EvalConfig,
    LoggingConfig,
    LoraSection,
    ModelConfig,
    OptimConfig,
    ProbeConfig,
    RolloutConfig,
    SurpriseSection,
    WindowSection,
)
from adwin.objectives.loss_table import ASYNCOPD_LOSSES, BEHAVIOR_LOSSES

__all__ = [
    "ASYNCOPD_LOSSES", "BEHAVIOR_LOSSES", "DEFAULT_PRESET", "DEFAULT_VLLM_GPU_MEMORY", "MAX_VLLM_GPU_MEMORY",
    "AsyncOPDSection", "AuditConfig", "ConfigSource", "ControllerSection", "DataConfig", "EvalConfig",
    "ISHighField", "ISLowField", "ISMethodField", "LoggingConfig", "LoraSection", "LossConfig", "ModelConfig", "OAPLSection",
    "OptimConfig", "ProbeConfig", "RolloutConfig", "SurpriseSection", "TrainConfig", "UnknownPreset",
    "WindowSection", "_Strict", "apply_overrides", "apply_policy_spec", "check_engines", "check_is_bounds", "check_oapl",
    "default_config_path", "lag_of", "load_config", "load_source", "parse_set", "policy_overrides",
    "preset_names", "preset_path", "resolve_config", "vllm_engine_count",
]
