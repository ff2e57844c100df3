"""The verl config users launch: the arguments ``trainer_adapters/verl/gpu_recipe.sh`` passes to verl's main, read
by running the script itself under bash with a stand-in ``python3`` that records them, composed with verl's own
Hydra config (the installed package's ``ppo_trainer``) as verl's main composes it."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

RECIPE = Path(__file__).resolve().parents[3] / "trainer_adapters" / "verl" / "gpu_recipe.sh"
RECORD = '#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$RECIPE_ARGS"\n'


@functools.cache
def recipe_argv(trainer: str | None = None) -> tuple[str, ...]:
    """What the recipe runs ``python3`` with (``-m``, the module, overrides), its variables at their defaults but
    ``TRAINER`` (None: the recipe's default)."""
    with tempfile.TemporaryDirectory() as tmp:
        shim = Path(tmp) / "python3"
        shim.write_text(RECORD)
        shim.chmod(0o755)
        out = Path(tmp) / "argv"
        env = {k: v for k, v in os.environ.items() if k not in {"DATA", "STUDENT", "TEACHER", "HORIZON", "STEPS",
                                                                   "CONTROLLER", "TRAINER"}}
        env |= {"PATH": f"{tmp}:{env.get('PATH', '')}", "RECIPE_ARGS": str(out)}
        env |= {} if trainer is None else {"TRAINER": trainer}
        subprocess.run(["bash", str(RECIPE)], env=env, check=True, timeout=60)
        return tuple(out.read_bytes().decode().split("\0")[:-1])


def verl_config(*extra: str, trainer: str | None = None) -> Any:
    """verl 0.9.1's ``ppo_trainer`` config with the recipe's overrides (``TRAINER=trainer``), then ``extra`` (Hydra
    override strings)."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose("ppo_trainer", overrides=list(recipe_argv(trainer)[2:]) + list(extra))
