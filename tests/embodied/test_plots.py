"""`embodied plot` (learning curves of runs) and `embodied info` (what this installation has)."""

import json
import sys

import pytest

from embodied.core.errors import ConfigError
from embodied.plots import curves, plot_runs, read_metrics
from tests.cli import embodied


def write_run(path, rows, cut_last=False):
    path.mkdir(parents=True)
    text = "".join(json.dumps(row) + "\n" for row in rows)
    (path / "metrics.jsonl").write_text(text + ('{"env_steps": 9' if cut_last else ""))
    return path


def test_training_and_sft_runs_share_one_figure_each_panel_with_the_runs_that_have_it(tmp_path):
    train = write_run(
        tmp_path / "ppo",
        [{"env_steps": 100 * i, "rollout/success_rate": i / 4, "rollout/episode_return": float(i)} for i in range(1, 5)]
        + [{"env_steps": 400, "eval/success_rate": 0.5}],
        cut_last=True,
    )
    sft = write_run(
        tmp_path / "sft", [{"iteration": 50 * i, "sft/loss": 1 / i, "sft/val_loss": 1.1 / i} for i in range(1, 4)]
    )
    panels = {metric: lines for metric, _, _, lines in curves({"ppo": read_metrics(train), "sft": read_metrics(sft)})}
    assert list(panels) == [
        "rollout/success_rate",
        "eval/success_rate",
        "rollout/episode_return",
        "sft/loss",
        "sft/val_loss",
    ]
    assert panels["rollout/success_rate"] == {"ppo": ([100, 200, 300, 400], [0.25, 0.5, 0.75, 1.0])}
    assert panels["eval/success_rate"] == {"ppo": ([400], [0.5])} and set(panels["sft/loss"]) == {"sft"}
    output = plot_runs([train, sft], tmp_path / "out" / "curves.png")
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and output.stat().st_size > 20_000


def test_what_cannot_be_plotted_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="no metrics.jsonl"):
        plot_runs([tmp_path], tmp_path / "x.png")
    broken = write_run(tmp_path / "broken", [{"env_steps": 1}])
    (broken / "metrics.jsonl").write_text('{"env_steps": 1\n{"env_steps": 2}\n')
    with pytest.raises(ConfigError, match="metrics.jsonl:1 is not a JSON line"):
        read_metrics(broken)
    empty = write_run(tmp_path / "empty", [{"env_steps": 1, "train/lr": 0.1}])
    with pytest.raises(ConfigError, match="no curves to plot"):
        plot_runs([empty], tmp_path / "x.png")


@pytest.mark.slow
def test_plot_and_info_from_the_command_line(tmp_path):
    run = write_run(tmp_path / "run", [{"env_steps": 10, "rollout/success_rate": 0.0}])
    result = embodied("plot", str(run), check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (run / "curves.png").is_file() and str(run / "curves.png") in result.stdout
    missing = embodied("plot", str(tmp_path / "nowhere"), check=False, timeout=120)
    assert missing.returncode == 2 and "no metrics.jsonl" in missing.stderr
    info = embodied("info", check=False, timeout=300)
    assert info.returncode == 0, info.stderr
    for expected in (
        "embodied-rl",
        "torch",
        "mani-skill",
        "CUDA",
        "Vulkan (ManiSkill)",
        "EGL (MuJoCo, LIBERO)",
        ".venv-libero",
    ):
        assert expected in info.stdout
    assert f"python       {sys.version.split()[0]}" in info.stdout
