"""`embodied train ... resume=<run>`: the config a resumed run continues with. The training
session every runtime shares is `embodied.runtime.session`; the loops are the runtimes'."""

from __future__ import annotations

from embodied.config import GROUPS, TrainConfig, override_key, resumed, saved_config, to_schema
from embodied.core.errors import ConfigError
from embodied.runs.checkpoint import (
    resolve_checkpoint,
    run_dir_of,
)

# How many learner ranks hold the policy, and how: a checkpoint is the same either way (whole
# weights and optimizer state), so a run may move to more or fewer of them.
RESCALABLE_ON_RESUME = ("runtime.learner_ranks", "runtime.learner_sharding")


def resume_config(resume: str, overrides: list[str]) -> TrainConfig:
    """The config a run was started with, plus overrides of top-level keys (e.g. a larger
    total_env_steps) and of its learner ranks. Settings of the env, policy, algo and runtime
    may be restated (the command that started the run, with resume= added); changing one is
    refused."""
    checkpoint = resolve_checkpoint(resume)
    run_dir = run_dir_of(checkpoint)
    if run_dir == checkpoint or checkpoint != resolve_checkpoint(run_dir):
        raise ConfigError(
            f"resume continues a run from its latest checkpoint: pass the run directory ({run_dir}). "
            f"To start from another checkpoint, start a new run and load its weights."
        )
    # the same command again with resume= added restates the run's settings: those must hold
    merged = resumed(TrainConfig, "train", saved_config(checkpoint / "config.yaml"), overrides, is_fixed, resume)
    merged.resume = str(run_dir)
    merged.run_dir = str(run_dir)
    return to_schema(TrainConfig, merged)


def is_fixed(override: str) -> bool:
    """A key of the env, policy, algo or runtime, which a resumed run keeps (but its ranks)."""
    key = override_key(override)
    return key.split(".")[0] in GROUPS and key not in RESCALABLE_ON_RESUME
