"""The built-in task (chained single-digit arithmetic, two sub-tasks), its tokenizer and models.

Importing this package is cheap (no torch); :func:`ensure_prepared` loads the heavy parts lazily.
"""

from adwin.tasks.assets import BuiltinAssets, adwin_home, assets_root, ensure_prepared, load_assets
from adwin.tasks.chain import (
    ANSWER_PREFIX,
    DEFAULT_CANDIDATES,
    MAX_RESPONSE_TOKENS,
    ROUTES,
    Problem,
    TaskSample,
    check_answer,
    extract_answer,
    generate_problems,
    generate_samples,
    iter_samples,
    parse_prompt,
    solution_for,
    verify_solution,
)

__all__ = [
    "ANSWER_PREFIX",
    "DEFAULT_CANDIDATES",
    "MAX_RESPONSE_TOKENS",
    "ROUTES",
    "BuiltinAssets",
    "Problem",
    "TaskSample",
    "adwin_home",
    "assets_root",
    "check_answer",
    "ensure_prepared",
    "extract_answer",
    "generate_problems",
    "generate_samples",
    "iter_samples",
    "load_assets",
    "parse_prompt",
    "solution_for",
    "verify_solution",
]
