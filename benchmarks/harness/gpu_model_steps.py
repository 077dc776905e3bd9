"""The GPU campaign's model steps: the built-in VLA's SFT then Flow-SDE PPO from pixels,
pipelining a GPU policy with CPU simulator workers, collocated placement of pi0 at its
published size, and OpenVLA-7B from its published layout. What the steps share (Scale,
StepResult, measure) is in gpu_steps.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness import gpu_steps  # its on_measured is the campaign's, set at run time
from harness.gpu_steps import Scale, StepResult, embodied, log, measure

# ---- 4. the built-in VLA from pixels and language: SFT, then Flow-SDE PPO ------------------------
# PickCube from its camera: the multi-task env cannot give one policy the same cameras (StackCube adds
# a hand camera) and a physx_cuda scene holds one task.
VLA_ENV = ["env=maniskill_pickcube", "env.obs_mode=rgb", "env.control_mode=pd_ee_delta_pos"]


# --smoke: the SFT and RL runs' evaluation episodes cut short (the demos keep PickCube's own
# limit, so the expert finishes them): each step of flow_vla on a CPU takes about half a second
SMOKE_EPISODES = ["env.max_episode_steps=10"]


def vla_sft(work: str, smoke: bool, device: str) -> dict[str, Any]:
    """Scripted demos and the SFT run the `vla` step starts RL from, in `work`/vla-sft. Run on
    a CPU before a GPU visit (`tools/gpu/kit.py prepare-vla`): the GPU machine has no
    LeRobotDataset writer for the demos, and the run travels small (frozen encoders stay out)."""
    work_dir = Path(work)
    small = (
        ["env.num_envs=1", "env.num_workers=0", "env.image_size=32"]
        if smoke
        else ["env.num_envs=2", "env.num_workers=2"]
    )
    demos, sft = work_dir / "vla-demos", work_dir / "vla-sft"
    if not (sft / "eval").is_dir():
        if not (demos / "meta" / "info.json").is_file():
            embodied(
                "demos",
                *VLA_ENV,
                *small,
                f"episodes={3 if smoke else 300}",
                f"dataset={demos}",
                cwd=work_dir,
                timeout=7200,
            )
        embodied(
            "sft",
            f"dataset={demos}",
            *VLA_ENV,
            *small,
            *(SMOKE_EPISODES if smoke else []),
            "policy=flow_vla",
            f"runtime.device={device}",
            f"iterations={2 if smoke else 4000}",
            f"eval_episodes={1 if smoke else 144}",
            f"run_dir={sft}",
            "logger.progress_bar=false",
            cwd=work_dir,
            timeout=7200,
        )
    return {"sft": str(sft)}


def vla(scale: Scale, work: Path) -> StepResult:
    """From the SFT run (made here under --smoke; carried from a CPU machine on a GPU visit),
    RL in calls of at most 8 minutes that resume each other (a command lasts at most 10 on the
    GPU machine) until 20 minutes of training are spent."""
    small = (
        ["env.num_envs=1", "env.num_workers=0", "env.image_size=32"]
        if scale.smoke
        else ["env.num_envs=48", "env.num_workers=16"]
    )
    sft, rl = work / "vla-sft", work / "vla-ppo"
    if not (sft / "eval").is_dir():
        if not scale.smoke:
            raise RuntimeError(
                f"no SFT run at {sft}: prepare it on a CPU (python tools/gpu/kit.py prepare-vla) and "
                f"carry .gpu/vla-sft.tar (docs/gpu.md)"
            )
        vla_sft(str(work), True, scale.device)
    from embodied.runs.checkpoint import load_checkpoint_state

    budget_s, per_call_s = (30, 30) if scale.smoke else (1200, 480)
    resuming = (rl / "checkpoints" / "latest").is_file()
    elapsed = (
        float(
            load_checkpoint_state(rl / "checkpoints" / (rl / "checkpoints" / "latest").read_text().strip()).get(
                "elapsed_s", 0.0
            )
        )
        if resuming
        else 0.0
    )
    limit = min(budget_s, elapsed + per_call_s)
    final = limit >= budget_s  # the last call evaluates; the others only train and checkpoint
    common = [
        f"time_limit_s={limit}",
        f"eval_episodes={(1 if scale.smoke else 144) if final else 0}",
        "logger.progress_bar=false",
    ]
    if resuming:
        embodied("train", f"resume={rl}", *common, cwd=work, timeout=600)
    else:
        embodied(
            "train",
            f"init={sft}",
            *VLA_ENV,
            *small,
            *(SMOKE_EPISODES if scale.smoke else []),
            "policy=flow_vla",
            "policy.sampler=flow_sde",
            "algo=ppo",
            f"runtime.device={scale.device}",
            f"algo.rollout_steps={2 if scale.smoke else 50}",
            f"algo.num_minibatches={1 if scale.smoke else 8}",
            "algo.update_epochs=1",
            f"total_env_steps={6 if scale.smoke else 10**9}",
            f"run_dir={rl}",
            *common,
            cwd=work,
            timeout=600,
        )
    before = json.loads(next((sft / "eval").glob("*/report.json")).read_text())["overall"]["success_rate"]
    report = next((rl / "eval").glob("*/report.json"), None)
    if report is None:  # this call's minutes are spent: the next `--only vla` call resumes the run
        return StepResult(
            "RL lifts success by >= 30 points within 20 GPU-minutes",
            None,
            [{"sft_success": before, "finished": False}],
            ["unfinished: run `--only vla` again"],
        )
    after = json.loads(report.read_text())["overall"]["success_rate"]
    return StepResult(
        "RL lifts success by >= 30 points within 20 GPU-minutes",
        after - before >= 0.30,
        [{"sft_success": before, "rl_success": after, "lift_points": 100 * (after - before), "finished": True}],
        ["PickCube steps on CPU workers, rendering its camera; the policy learns on the GPU"],
    )


# ---- 5. pipelining: a GPU policy and CPU simulator workers --------------------------------------
def pipeline_rates(
    workers: int, num_envs: int, steps: int, device: str, width: int, depths: list[int]
) -> dict[str, Any]:
    import torch

    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.sim.maniskill import make_maniskill
    from embodied.sim.maniskill_common import ManiSkillConfig
    from harness.pipelining import STAGES, pipelining_bound, rollout_rates, seconds_per_call, stage_step

    started = time.time()
    env = make_maniskill(ManiSkillConfig(task="PushCube-v1", num_envs=num_envs, num_workers=workers), seed=0)
    log(f"pipeline: {workers} workers, {num_envs} envs built in {time.time() - started:.0f} s")
    try:
        zeros = np.zeros((num_envs, 1, env.spec.action_dim), np.float32)
        step_s = seconds_per_call(lambda: env.step(zeros), repeats=5)
        env.group_stages(STAGES)  # as the rollout groups them (runtime.pipeline_stages)
        stage_s = float(np.mean([seconds_per_call(lambda k=k: stage_step(env, k, zeros), 5) for k in range(STAGES)]))
        observation = env.reset().to_torch(device)
        stage_observation = observation.select(env.stage_rows(0))
        # A policy whose inference lasts about one env step, where pipelining pays most, and
        # whose cost grows with the rows it infers, as a VLA's does (a small MLP's is bound by
        # kernel launches instead, and a stage would cost as much as the whole batch): wide
        # layers over enough rows, deeper until it lasts an env step. Built on the device, as
        # CPU initialisation of big layers is slow.
        for depth in depths:
            with torch.device(device):
                policy = MLPGaussianPolicy(MLPPolicyConfig(actor_hidden=[width] * depth, critic_hidden=[256]), env.spec)
            with torch.no_grad():
                inference_s = seconds_per_call(lambda policy=policy: policy.act(observation), repeats=5)
                stage_inference_s = seconds_per_call(lambda policy=policy: policy.act(stage_observation), repeats=5)
            log(
                f"pipeline: depth {depth}: inference {1e3 * inference_s:.1f} ms (one stage's rows "
                f"{1e3 * stage_inference_s:.1f} ms), env step {1e3 * step_s:.1f} ms"
            )
            if inference_s >= step_s:
                break
        rates = rollout_rates(env, policy, steps, device)
    finally:
        env.close()
    return {
        "workers": workers,
        "stages": STAGES,
        "num_envs": num_envs,
        "env_step_ms": 1e3 * step_s,
        "stage_step_ms": 1e3 * stage_s,
        "inference_ms": 1e3 * inference_s,
        "stage_inference_ms": 1e3 * stage_inference_s,
        "depth": depth,
        "width": width,
        **rates,
        "speedup": rates["pipelined"] / rates["sequential"],
        "bound": pipelining_bound(step_s, stage_s, inference_s, STAGES, stage_inference_s),
    }


def pipeline(scale: Scale, work: Path) -> StepResult:
    from harness.pipelining import STAGES

    rows = []
    for w in [2] if scale.smoke else [4, 8, 16]:
        try:
            rows.append(
                measure(
                    "pipeline_rates",
                    workers=w,
                    num_envs=w if scale.smoke else 16 * w,
                    steps=2 if scale.smoke else 40,
                    device=scale.device,
                    width=64 if scale.smoke else 4096,
                    depths=[2] if scale.smoke else [4, 16, 32, 64, 128, 256],
                    timeout=900 if scale.smoke else 240,  # a row that takes longer is broken
                )
            )
        except RuntimeError as error:  # recorded; the next row still runs
            rows.append({"workers": w, "error": str(error).splitlines()[0]})
    measured = [r["speedup"] for r in rows if "speedup" in r]
    if not measured:
        raise RuntimeError(f"no pipeline row finished: {[r['error'] for r in rows]}")
    return StepResult(
        "pipelined >= 1.6x sequential (RLinf reports 1.61-1.88x)",
        max(measured) >= 1.6,
        rows,
        [
            f"the env workers in {STAGES} stages (runtime.pipeline_stages); bound: the best ratio the "
            "row's own step and inference times allow (benchmarks/pipeline.py)"
        ],
    )


# ---- 6. collocated placement on one GPU ----------------------------------------------------------
def synthetic_tokenizer(path: Path) -> Path:
    """A word-level tokenizer with a BOS token, standing in for PaliGemma's (which no registry
    package ships): placement measures memory and copies, which the vocabulary does not change."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<unk>", "push", "pick", "the", "cube", "to", "goal", "region", "up"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>"
    ).save_pretrained(str(path))
    return path


def placement(scale: Scale, work: Path) -> StepResult:
    from harness import placement_runs

    # pi0 at its published size (PaliGemma 3B + Gemma 300M), random weights; --smoke: its tiny variants
    sizes = ("tiny", "tiny_expert", "cpu") if scale.smoke else ("gemma_2b", "gemma_300m", "cuda")
    overrides = [
        "policy=pi0",
        f"policy.paligemma_variant={sizes[0]}",
        f"policy.expert_variant={sizes[1]}",
        f"policy.tokenizer={synthetic_tokenizer(work / 'tokenizer')}",
        "env.obs_mode=rgb",
        f"env.num_envs={2 if scale.smoke else 8}",
        f"runtime.device={sizes[2]}",
        f"runtime.rollout_device={sizes[2]}",
        # the fewest steps that still roll out, update and move the weights each time: what is
        # measured is memory and the moves (13 GB of float32 weights each way at pi0's size)
        "algo.rollout_steps=2" if scale.smoke else "algo.rollout_steps=4",
        *(["algo.num_minibatches=1", "algo.update_epochs=1"] if scale.smoke else []),
    ]
    # each run is given 4 minutes on a GPU: a call lasts 10, and the log says how far one got
    rows = []
    for name in placement_runs.PLACEMENTS:
        try:
            rows.append(placement_runs.run(name, 1 if scale.smoke else 2, overrides, None if scale.smoke else 240))
        except SystemExit as error:  # recorded; the other placement still runs
            rows.append({"placement": name, "error": str(error)[-2000:]})
        gpu_steps.on_measured(rows[-1])
    if all("error" in row for row in rows):
        raise RuntimeError(f"no placement run finished: {rows[0]['error'][:300]}")
    peaks = [row.get("device_peak_gb") for row in rows]
    return StepResult(
        "collocated needs less peak GPU memory than disaggregated; the cost is the offload time",
        None if scale.smoke or None in peaks else peaks[1] < peaks[0],
        rows,
    )


# ---- 8. OpenVLA-7B from the published layout: load, rollout and GRPO with LoRA --------------------
def openvla(scale: Scale, work: Path) -> StepResult:
    import shutil

    import torch

    from harness.openvla_measure import SIZES, save_random_checkpoint
    from harness.openvla_measure import measure as measure_openvla

    device = torch.device(scale.device)
    variant, size, batch, minibatch, runs = SIZES[scale.smoke]
    folder = work / "openvla"
    save_s = save_random_checkpoint(folder, variant, device, size)
    try:
        rows = [
            measure_openvla(folder, decoder, chunk, batch, minibatch, runs, device, size)
            for decoder, chunk in (("parallel", 8), ("causal", 1))  # OFT's (SimpleVLA-RL's) first
        ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # 15 GB at 7B
    return StepResult(
        "OpenVLA-7B (random weights) loads from the published layout and runs rollout and GRPO "
        "with LoRA and bfloat16 on one GPU: load time, chunks/s over 64 envs, samples/s, peak memory",
        None,
        rows,
        [f"saving the published layout took {save_s:.0f} s"],
    )


MEASUREMENTS = {"vla_sft": vla_sft, "pipeline_rates": pipeline_rates}
