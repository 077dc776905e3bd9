"""The arithmetic behind reported benchmark figures: a speed ratio against its bound,
intervention speedups where a run missed its goal (a lower bound, never an exact figure), and
the run records the reports are rebuilt from; and the benchmarks' layout: studies share code
only through benchmarks/harness/."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import encoder_probe  # noqa: E402  (benchmarks/encoder_probe.py, a study)
import hil  # noqa: E402  (benchmarks/hil.py, a study)
import placement  # noqa: E402  (benchmarks/placement.py, a study)
import sac_learner  # noqa: E402  (benchmarks/sac_learner.py, a study)

from harness import intervention_study, runs, stats, tuning  # noqa: E402  (benchmarks/harness/, what the studies share)


def row(name: str, seconds: float, copies: float = 0.0) -> dict:
    return {"placement": name, "seconds_per_update": seconds, "offload_s_per_update": copies}


def test_placement_ratio_is_compared_with_the_bound_its_copies_set():
    results = [
        row("disaggregated", 10.0),
        row("collocated", 11.0, 0.5),
        row("collocated", 11.4, 0.7),
        row("disaggregated", 10.4),
    ]
    comparison = placement.compare(results)
    assert comparison["collocated_time_ratio"] == pytest.approx(11.2 / 10.2)
    assert comparison["ratio_lower_bound"] == pytest.approx((10.2 + 0.6) / 10.2)
    assert comparison["noise"] == pytest.approx(0.4 / 10.2)
    assert not comparison["beyond_bound"]


def test_a_collocated_run_faster_than_its_bound_allows_is_flagged():
    # collocated 8% faster than disaggregated though it copies, and rounds agree within 1%
    results = [
        row("disaggregated", 10.0),
        row("collocated", 9.2, 0.5),
        row("collocated", 9.25, 0.5),
        row("disaggregated", 10.05),
    ]
    assert placement.compare(results)["beyond_bound"]


def test_the_probe_scores_held_out_episodes_with_the_ridge_strength_validation_chose():
    rng = np.random.default_rng(0)
    episodes = np.repeat(np.arange(encoder_probe.EPISODES), 10)
    position = rng.normal(0, 5, (len(episodes), 2))
    noise = rng.normal(size=(len(position), 20))
    features = np.c_[position @ rng.normal(size=(2, 6)), noise]  # the position, linearly, and noise
    informative = encoder_probe.readout(features, position, episodes)
    assert max(informative["rmse_cm"]) < 0.05 and informative["dim"] == 26
    uninformative = encoder_probe.readout(noise, position, episodes)
    assert min(uninformative["rmse_cm"]) > 0.9 * min(uninformative["baseline_rmse_cm"]) > 4
    # what the held-out episodes hold changes their score, never the strength chosen
    held_out = episodes >= encoder_probe.VALIDATE.stop
    shuffled = position.copy()
    shuffled[held_out] = rng.permutation(shuffled[held_out])
    scrambled = encoder_probe.readout(features, shuffled, episodes)
    assert scrambled["ridge"] == informative["ridge"] and min(scrambled["rmse_cm"]) > 1


def test_intervention_speedups_are_exact_only_where_both_runs_reached_the_goal():
    rlpd_reached = {101: 16_000, 102: None, 103: 12_000}
    rlpd_budget = {101: 20_000, 102: 20_000, 103: 20_000}
    arm_reached = {101: 4_000, 102: 5_000, 103: None}
    assert intervention_study.speedups(rlpd_reached, rlpd_budget, arm_reached) == [
        (4.0, True),
        (4.0, False),
        (None, False),
    ]


def test_held_from_is_the_first_evaluation_after_the_last_dip():
    curve = [{"env_steps": s, "eval/success_rate": v} for s, v in [(1, 0.5), (2, 0.95), (3, 0.8), (4, 0.9), (5, 1.0)]]
    assert stats.held_from(curve, 0.9) == 4
    assert stats.held_from(curve[:3], 0.9) is None


def test_a_compact_run_record_keeps_every_evaluation_and_the_whole_logs_statistics():
    lines = [
        {"env_steps": 4 * i, "train/env_steps_per_s": float(i), "replay/intervened": float(i % 2), "loss": 1.0}
        for i in range(1, 5001)
    ]
    for i in range(499, 5000, 500):
        lines[i]["eval/success_rate"] = i / 5000
    record = runs.compact(lines)
    curve = record["curve"]
    assert len(curve) <= runs.TRAINING_POINTS + 1 + 10
    assert [p["eval/success_rate"] for p in curve if "eval/success_rate" in p] == [
        i / 5000 for i in range(499, 5000, 500)
    ]
    assert curve[-1]["env_steps"] == 20000 and curve[-1]["train/env_steps_per_s"] == 5000.0
    assert record["env_steps_per_s_median"] == 2500.5  # over all 5000 lines, not the kept ones
    assert record["intervened_mean"] == 0.5
    assert "loss" not in curve[0]


def benchmark_settings() -> dict[str, list[str]]:
    import dsrl  # noqa: PLC0415  (benchmarks/dsrl.py, a study)

    settings = {
        f"hil {name} {arm}": [*study.common, *overrides]
        for name, study in hil.STUDIES.items()
        for arm, overrides in study.arms.items()
    }
    for key, arms in hil.TUNING_ARMS.items():
        study = hil.STUDIES[key]
        plain = study.arms[next(iter(study.arms))]
        settings.update({f"hil tune {key} {arm}": [*study.common, *plain, *extra] for arm, extra in arms.items()})
    import wsrl  # noqa: PLC0415  (benchmarks/wsrl.py, a study)

    settings.update(
        {f"wsrl {arm}": wsrl.settings(101, [*wsrl.arm_data(arm), *extra]) for arm, extra in wsrl.ARMS.items()}
    )
    settings["dsrl flow-sde"] = dsrl.arm_settings("flow-sde", 101)
    settings["dsrl dsrl"] = [*dsrl.DSRL, "seed=101"]
    return settings


@pytest.mark.parametrize("name", list(benchmark_settings()))
def test_every_benchmark_arm_composes_into_a_valid_config(name):
    """A typo in an arm's overrides fails here, not hours into a benchmark."""
    from embodied.config import TrainConfig, to_schema
    from embodied.core.compose import compose

    config = to_schema(TrainConfig, compose("train", benchmark_settings()[name]))
    if "pixels" in name:
        wrist = config.env.robot == "panda_wristcam"
        assert config.env.obs_mode == "rgb"
        assert (config.operator.policy == "scripted") == name.endswith("corrections")
    if "pixels" in name and "dsrl" not in name:
        # demos recorded with the cameras the arm's policy reads
        assert config.algo.dataset.endswith("pixel-demos-20-wristcam" if wrist else "pixel-demos-20")
    if "pixels-dsrl" in name:
        # DSRL steers the VLA SFT'd on the pixel study's demos (the SFT the study runs first)
        assert config.policy.name == "flow_vla" and config.policy.latent_actor and config.algo.name == "dsrl"
        sft_dir, _, sft_settings = hil.STUDIES["pixels-dsrl"].sft
        assert config.init == str(sft_dir) and f"dataset={hil.PIXEL_DEMOS}" in sft_settings
        from embodied.config import SFTConfig

        sft = to_schema(SFTConfig, compose("sft", sft_settings))
        assert sft.policy.name == "flow_vla" and sft.env.obs_mode == "rgb"
    if "pickcube-state" in name:
        assert config.env.obs_mode == "state" and "pickcube-state-demos-" in config.algo.dataset
        # an arm with an operator names it: its corrections, or the stall operator's arms built on it
        assert (config.operator.policy == "scripted") == ("corrections" in name or "-stall-" in name)
    if name.startswith("dsrl"):
        assert config.init.endswith("flow-sft") and config.keep_checkpoints >= 6
    if name.startswith("wsrl"):
        # every arm learns from the same 20 demos; only RLPD from scratch skips Cal-QL pretraining
        # and keeps the demos in the critics' batches
        scratch = name == "wsrl rlpd"
        assert config.algo.dataset.endswith("hil-demos-20") and config.seed == 101
        assert (config.algo.offline_pretrain_steps == 0) == scratch and config.algo.retain_offline == scratch


def test_the_pickcube_state_check_differs_from_the_pixel_study_only_in_observations_and_demos():
    pixels, state = hil.STUDIES["pixels"], hil.STUDIES["pickcube-state"]
    observation = ("env.obs_mode=", "env.image_size=", "algo.dataset=")
    assert [o for o in pixels.common if not o.startswith(observation)] == [
        o for o in state.common if not o.startswith(observation)
    ]
    assert list(state.arms.values()) == list(pixels.arms.values())
    assert (pixels.steps, pixels.eval_every) == (state.steps, state.eval_every)


def test_the_serl_study_is_the_state_study_with_the_temperature_tuning_chose():
    state, serl = hil.STUDIES["pickcube-state"], hil.STUDIES["pickcube-state-serl"]
    assert serl.common == [*state.common, *hil.SERL_TEMPERATURE]
    # the state study's arms, then corrections by the stall operator, alone, at UTD 4 and from a
    # Cal-QL policy handed over as WSRL's anchored arm
    *same, stall, stall_utd4, stall_wsrl = serl.arms.values()
    assert same == list(state.arms.values())
    tuned = hil.TUNING_ARMS["pickcube-state"]
    assert [*hil.SERL_TEMPERATURE, *stall] == tuned["rlpd-serl-stall-corrections"]
    assert [*hil.SERL_TEMPERATURE, *stall_utd4] == tuned["rlpd-serl-stall-utd4"]
    assert [*hil.SERL_TEMPERATURE, *stall_wsrl] == tuned["rlpd-serl-stall-wsrl-anchored"]
    assert (serl.steps, serl.eval_every, serl.scripted_demos) == (state.steps, state.eval_every, state.scripted_demos)
    assert hil.TUNING_ARMS["pickcube-state"]["rlpd-serl-time-limit-demos"] == hil.SERL_TEMPERATURE


def test_a_report_without_its_runs_leaves_the_committed_summary_alone(tmp_path, monkeypatch):
    # a clone holds no run records for hil.py's first study: its report must not overwrite
    # the committed figures with empty ones
    monkeypatch.setattr(runs, "RESULTS", tmp_path)
    monkeypatch.setattr(hil, "RESULTS", tmp_path)
    (tmp_path / "hil.md").write_text("committed")
    with pytest.raises(SystemExit, match="nothing to report"):
        hil.report()
    assert [p.name for p in tmp_path.iterdir()] == ["hil.md"]
    assert (tmp_path / "hil.md").read_text() == "committed"


def test_a_run_record_takes_its_wall_time_from_the_trainers_clock_not_from_a_resume(tmp_path, monkeypatch):
    """A resume rewrites config.yaml after the last checkpoint: file times would give a negative wall time."""
    import json
    import os

    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(runs, "RESULTS", tmp_path / "results")
    run = tmp_path / "runs" / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    lines = [{"env_steps": 4 * i, "train/elapsed_s": 10.0 * i} for i in range(1, 6)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    (run / "checkpoints" / "latest").write_text("iter_5")
    (run / "config.yaml").write_text("seed: 1\n")
    os.utime(run / "checkpoints" / "latest", (1000, 1000))  # the last checkpoint, before the resume
    os.utime(run / "config.yaml", (5000, 5000))
    runs.collect("resumed")
    assert json.loads((tmp_path / "results" / "runs" / "resumed.json").read_text())["wall_time_s"] == 50.0


def test_a_run_trained_again_from_scratch_drops_the_earlier_records_provenance_and_heldout(tmp_path, monkeypatch):
    """Its run directory gone, a run is trained anew: the record must name this training's
    commit, and the old held-out figures belong to the other training."""
    import json

    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(runs, "RESULTS", tmp_path / "results")
    run = tmp_path / "runs" / "again"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"env_steps": 4, "train/elapsed_s": 7.0}) + "\n")
    record = tmp_path / "results" / "runs" / "again.json"
    record.parent.mkdir(parents=True)
    earlier = {"provenance": {"commit": "0000000"}, "heldout": {"seed": 1}, "seed": 101}
    record.write_text(json.dumps(earlier))
    runs.collect("again")  # a resume of the same training keeps them
    assert json.loads(record.read_text())["provenance"] == {"commit": "0000000"}
    runs.collect("again", fresh=True)
    collected = json.loads(record.read_text())
    assert "heldout" not in collected and "seed" not in collected
    assert collected["provenance"]["commit"] != "0000000" and collected["wall_time_s"] == 7.0


def test_a_study_prepares_its_demos_then_the_sft_run_its_arms_start_from(monkeypatch):
    calls = []
    monkeypatch.setattr(intervention_study, "record_scripted_demos", lambda *args: calls.append(("demos", args)))
    monkeypatch.setattr(intervention_study, "sft_or_resume", lambda *args: calls.append(("sft", args)))
    study = hil.STUDIES["pixels-dsrl"]
    study.prepare()
    folder, steps, settings = study.sft
    assert calls == [("demos", study.scripted_demos), ("sft", (folder, steps, settings))]


def test_the_tuning_report_rebuilds_from_its_committed_records(tmp_path, monkeypatch):
    """`hil.py tune pickcube-state report` writes the committed summary again, byte for byte,
    from results/runs/ alone (no run directory)."""
    import shutil

    committed = runs.RESULTS
    shutil.copytree(committed / "runs" / "hil_pickcube_state_tuning", tmp_path / "runs" / "hil_pickcube_state_tuning")
    monkeypatch.setattr(runs, "RESULTS", tmp_path)
    monkeypatch.setattr(tuning, "RESULTS", tmp_path)
    tuning.tune_report(hil.STUDIES["pickcube-state"], "pickcube-state")
    name = "hil_pickcube_state_tuning.md"
    assert (tmp_path / name).read_text() == (committed / name).read_text()
    assert (
        "| rlpd-serl-temperature | algo.init_temperature=0.01 algo.backup_entropy=false |"
        in (tmp_path / name).read_text()
    )


def test_the_learner_cost_report_rebuilds_from_its_committed_json(tmp_path, monkeypatch):
    """`sac_learner.py report` writes the committed summary again, byte for byte, with every
    configuration as a ratio to the state learner."""
    import json

    committed = sac_learner.RESULTS
    summary = json.loads((committed / "sac_learner.json").read_text())
    assert list(summary["rows"]) == list(sac_learner.CONFIGS)
    assert summary["rows"]["state"]["ratio_to_state"] == 1.0
    for row in summary["rows"].values():
        assert row["total_ms"] >= max(row["encode_ms"], row["update_ms"])
    monkeypatch.setattr(sac_learner, "RESULTS", tmp_path)
    sac_learner.report(summary)
    assert (tmp_path / "sac_learner.md").read_text() == (committed / "sac_learner.md").read_text()


def test_the_runtime_speed_report_rebuilds_from_its_committed_json_with_ratios_to_local(tmp_path):
    """`hil.py speed report` writes the committed summary again, byte for byte; its ratio and
    the time 50k env steps take are the medians' own."""
    import json

    from harness import runtime_speed

    committed = runs.RESULTS
    result = json.loads((committed / f"{hil.SPEED}.json").read_text())
    runtime_speed.report(result, tmp_path, hil.SPEED, hil.SPEED_SETTING)
    text = (tmp_path / f"{hil.SPEED}.md").read_text()
    assert text == (committed / f"{hil.SPEED}.md").read_text()
    rates = result["env_steps_per_s"]
    assert [len(runs_) for runs_ in rates.values()] == [2, 2]  # two runs each: the median is their mean
    local, procs = (sum(rates[name]) / 2 for name in ("local", "procs, lag 1"))
    assert f"| {procs / local:.2f}x |" in text and f"| {50_000 / local / 60:.0f} min |" in text


def test_a_run_records_the_code_it_was_trained_with_not_what_is_checked_out_when_it_ends(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(runs, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(runs, "RESULTS", tmp_path / "results")
    commits = iter(["abc1234", "def5678+changes"])  # a commit lands while the run trains
    monkeypatch.setattr(runs, "provenance", lambda script: {"commit": next(commits), "machine": "m", "command": script})

    def training(command, **kwargs):
        run = tmp_path / "runs" / "long"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"env_steps": 8, "train/elapsed_s": 3.0}) + "\n")

    monkeypatch.setattr(runs.subprocess, "run", training)
    runs.train("long", [], 8)
    assert json.loads((tmp_path / "results" / "runs" / "long.json").read_text())["provenance"]["commit"] == "abc1234"


def benchmark_imports() -> dict[str, set[str]]:
    """Every module of benchmarks/ (a study `hil`, a harness module `harness.runs`) and the
    modules of benchmarks/ it imports, at the top or inside a function."""
    paths = {path.stem: path for path in BENCHMARKS.glob("*.py")}
    paths.update(
        {"harness" if p.stem == "__init__" else f"harness.{p.stem}": p for p in (BENCHMARKS / "harness").glob("*.py")}
    )
    graph = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: a relative import; the studies and the harness import absolutely"
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        graph[name] = {module for module in imported if module in paths and module != name}
    return graph


def test_studies_share_code_only_through_the_harness():
    """A study (a top-level benchmarks/*.py) imports the harness and installed packages, never
    another study; the harness imports no study; and no study edits sys.path (to find the harness
    or anything else: what a study needs from tests/ it runs with `python -m` from the root)."""
    graph = benchmark_imports()
    studies = {name for name in graph if not name.startswith("harness")}
    assert {"ppo", "hil", "gpu_campaign"} <= studies and "harness.runs" in graph  # found them at all
    crossing = {name: sorted(imported & studies) for name, imported in graph.items() if imported & studies}
    assert not crossing, f"imports of studies (move what they share into benchmarks/harness/): {crossing}"
    for study in studies:
        assert "sys.path" not in (BENCHMARKS / f"{study}.py").read_text(), study


def test_the_benchmarks_have_no_import_cycle():
    graph = benchmark_imports()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError(f"import cycle: {' -> '.join([*path[path.index(name) :], name])}")
        if name not in done:
            for imported in sorted(graph[name]):
                visit(imported, [*path, name])
            done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_the_latency_study_measures_jumps_where_a_chunk_takes_over_across_ticks_without_a_command(tmp_path):
    import json

    import latency

    client = tmp_path / "client0"
    client.mkdir()
    summary = {
        "episodes": [{"success": True}, {"success": False}],
        "overrun_ticks": 1,
        "skipped_actions": 2,
        "round_trip_ms": {"p50": 3.0},
    }
    (client / "summary.json").write_text(json.dumps(summary))
    steps = [
        {"episode": 0, "tick": 0, "source": "none"},
        {"episode": 0, "tick": 1, "source": "policy", "executed_action": [0.0, 0.0], "handoff_ticks": 1},
        {"episode": 0, "tick": 2, "source": "policy", "executed_action": [0.0, 1.0]},  # within: 1
        {"episode": 0, "tick": 3, "source": "none"},  # waiting: the last command stands
        {"episode": 0, "tick": 4, "source": "policy", "executed_action": [3.0, 5.0], "handoff_ticks": 2},  # 5
        {"episode": 1, "tick": 0, "source": "policy", "executed_action": [9.0, 9.0], "handoff_ticks": 0},
        {"episode": 1, "tick": 1, "source": "policy", "executed_action": [9.0, 6.0]},  # within: 3
    ]
    (client / "steps.jsonl").write_text("\n".join(json.dumps(step) for step in steps))
    cell = latency.measure_cell([client])
    assert cell["success"] == 0.5 and cell["episodes"] == 2
    assert cell["boundary_jump"] == 5.0 and cell["boundaries"] == 1  # a new episode's first is no jump
    assert cell["within_chunk_change"] == 2.0


def pipelined_period(step_s: float, inference_s: float, stages: int, rounds: int = 40) -> float:
    """A round's seconds in `Rollout._collect_pipelined`'s schedule, worked out event by event:
    the policy serves the stages in order, one inference at a time, each stage waiting for its
    step to end; the mean over the last half of `rounds` (the steady state)."""
    policy_free, step_end, round_end = 0.0, [0.0] * stages, []
    for _ in range(rounds):
        for k in range(stages):
            policy_free = max(policy_free, step_end[k]) + inference_s
            step_end[k] = policy_free + step_s
        round_end.append(policy_free)
    half = rounds // 2
    return (round_end[-1] - round_end[half - 1]) / (rounds - half)


@pytest.mark.parametrize(
    "step_s, stage_s, inference_s, stage_inference_s, stages",
    [
        (2.0, 1.0, 1.0, None, 2),  # inference in proportion to rows, as on CPU cores
        (2.0, 2.0, 1.0, None, 2),  # a stage steps as long as the whole batch (parallel workers)
        (2.0, 1.0, 1.0, 1.0, 2),  # flat inference: a stage's batch costs the whole batch's
        (2.0, 0.5, 1.0, 1.0, 4),  # four stages of flat inference: the policy is the bottleneck
        (4.0, 1.0, 1.0, 0.6, 4),
        (1.0, 1.0, 3.0, 3.0, 3),
    ],
)
def test_the_pipelining_bound_is_the_schedules_own(step_s, stage_s, inference_s, stage_inference_s, stages):
    from harness.pipelining import pipelining_bound

    per_stage = inference_s / stages if stage_inference_s is None else stage_inference_s
    sequential = step_s + inference_s
    expected = sequential / pipelined_period(stage_s, per_stage, stages)
    assert pipelining_bound(step_s, stage_s, inference_s, stages, stage_inference_s) == pytest.approx(expected)
