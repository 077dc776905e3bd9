import pytest

from embodied.core.types import EpisodeStats
from embodied.eval_episodes import summarize, wilson_interval, write_report


@pytest.mark.parametrize(
    "successes,trials,low,high",
    [
        (0, 10, 0.0, 0.2775),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
        (45, 50, 0.7864, 0.9565),
    ],
)
def test_wilson_interval_matches_published_values(successes, trials, low, high):
    got = wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_report_groups_episodes_by_task(tmp_path):
    episodes = [
        EpisodeStats(0, "A", 1.0, 10, True),
        EpisodeStats(1, "A", 0.0, 20, False),
        EpisodeStats(0, "B", 3.0, 30, True),
    ]
    report = write_report(tmp_path, episodes, {"checkpoint": "x"})
    assert [t["task"] for t in report["tasks"]] == ["A", "B"]
    assert report["tasks"][0]["success_rate"] == 0.5 and report["tasks"][0]["mean_length"] == 15
    assert report["overall"]["episodes"] == 3
    assert "| all | 3 | 66.7% |" in (tmp_path / "report.md").read_text()
    assert summarize("none", []).success_ci95 == (0.0, 1.0)
