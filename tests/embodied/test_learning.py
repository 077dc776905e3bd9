"""Learning regressions: a change that silently stops PPO from learning fails here, not only
in a benchmark run days later. Budgeted in env steps, not wall time.

PPO on InvertedPendulum-v4 (`experiment=mujoco_invertedpendulum`, 20480 env steps, about 10 s
a run on one core), deterministic evaluation over 5 episodes. Measured at this budget, seeds
1-6: 502, 1000, 1000, 1000, 124 and 1000; one PPO iteration (2048 steps) gives 39 and 34 for
seeds 1 and 2. The test takes the first two seeds and asks for a mean a learner that does not
learn cannot reach."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 20480  # env steps: 10 PPO iterations of 2048
SEEDS = (1, 2)
GOAL = 150.0  # mean deterministic return over the seeds; untrained about 35, the task's best 1000


def evaluated_return(run_dir: Path, seed: int) -> float:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "embodied.cli",
            "train",
            "experiment=mujoco_invertedpendulum",
            f"total_env_steps={BUDGET}",
            f"seed={seed}",
            "eval_episodes=5",
            "logger.progress_bar=false",
            f"run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((run_dir / "eval" / "InvertedPendulum-v4" / "report.json").read_text())
    assert report["env_steps"] >= BUDGET
    return report["overall"]["mean_return"]


def test_ppo_learns_to_balance_the_pendulum_within_its_env_step_budget(tmp_path):
    returns = [evaluated_return(tmp_path / f"seed{seed}", seed) for seed in SEEDS]
    assert sum(returns) / len(returns) >= GOAL, returns
