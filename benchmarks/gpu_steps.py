"""The GPU campaign's steps (`gpu_campaign.py` runs them). Each takes a `Scale` (real sizes on
a GPU, toy sizes with `--smoke`) and a work folder, and returns its rows, its goal and
whether the goal was met. Anything that builds a ManiSkill GPU scene runs in a process of its
own (`measure`), so one scene never outlives its measurement and a crash costs one row."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Scale:
    smoke: bool  # toy sizes on a CPU: physx_cpu, one env, a few steps

    @property
    def sim_backend(self) -> str:
        return "physx_cpu" if self.smoke else "physx_cuda"

    @property
    def env_backend(self) -> str:  # the config's name for the batched adapter on that backend
        return "cpu_batched" if self.smoke else "gpu"

    @property
    def device(self) -> str:
        return "cpu" if self.smoke else "cuda"

    def sizes(self, *real: int) -> list[int]:
        return [1] if self.smoke else list(real)


def require_physx_gpu(scale: Scale) -> None:
    """physx_cuda needs SAPIEN's PhysX GPU library, which SAPIEN downloads from GitHub the first
    time: where it is missing and GitHub is out of reach, say so before anything runs."""
    import socket

    from embodied.sim.maniskill_common import PHYSX_GPU_RELEASES, physx_gpu_library

    if scale.smoke or physx_gpu_library().is_file():  # smoke: physx_cpu
        return
    try:
        socket.getaddrinfo("github.com", 443)
    except OSError:
        raise RuntimeError(
            f"physx_cuda needs SAPIEN's PhysX GPU library at {physx_gpu_library()}, which is not here, and "
            f"GitHub ({PHYSX_GPU_RELEASES}) is out of reach: carry it with the kit "
            f"(`python tools/gpu/kit.py prepare --physx-gpu linux-so.zip`)"
        ) from None


@dataclass
class StepResult:
    goal: str
    met: bool | None  # None: nothing to meet (a measurement)
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def embodied(*arguments: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """An `embodied` command as a user types it; its output is kept for the step's notes."""
    result = subprocess.run(
        [sys.executable, "-m", "embodied.cli", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"embodied {' '.join(arguments[:2])} failed:\n{result.stderr[-3000:]}")
    return result


def log(message: str) -> None:
    """A measurement's progress, on stderr: `measure` echoes it into the campaign's log."""
    print(message, file=sys.stderr, flush=True)


# Called with each measurement as it comes: the campaign publishes a step's rows before the step
# ends, since GPU time (or a call's limit) can end in the middle of one.
on_measured: Callable[[dict[str, Any]], None] = lambda row: None


def measure(name: str, timeout: float = 900, **arguments: Any) -> dict[str, Any]:
    """`MEASUREMENTS[name](**arguments)` in a fresh process; its JSON result. Its stderr is echoed
    as it comes, so the campaign's log shows where a long measurement is; killed after `timeout`."""
    process = subprocess.Popen(
        [sys.executable, __file__, name, json.dumps(arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    try:
        for line in process.stderr:
            sys.stderr.write(line)
            tail.append(line)
        stdout = process.stdout.read()
        process.wait()
    finally:
        timer.cancel()
    if process.returncode != 0:
        cause = f"killed after {timeout:.0f} s" if process.returncode == -9 else f"exit {process.returncode}"
        raise RuntimeError(f"{name}({arguments}) failed ({cause}):\n{''.join(tail)[-3000:]}")
    row = json.loads(stdout.strip().splitlines()[-1])
    on_measured(row)
    return row


# ---- 1. correctness: the batched (GPU) env against the CPU env on the same seeds ---------------
def compare_envs(task: str, num_envs: int, sim_backend: str, chunk: int, seed: int) -> dict[str, Any]:
    from embodied.core.env import episode_seed
    from embodied.sim.maniskill import make_maniskill
    from embodied.sim.maniskill_batched import ManiSkillBatchedEnv
    from embodied.sim.maniskill_common import ManiSkillConfig

    config = ManiSkillConfig(task=task, num_envs=num_envs)
    reference = make_maniskill(dataclasses.replace(config, backend="cpu"), seed=seed)
    candidate = ManiSkillBatchedEnv(config, base_seed=seed, sim_backend=sim_backend)
    try:
        seeds = [episode_seed(seed, i, 0) for i in range(num_envs)]
        first = [reference.reset(seeds=seeds).state, candidate.reset(seeds=seeds).state]
        spec = reference.spec
        limit = int(spec.max_episode_steps)
        rng = np.random.default_rng(seed)
        low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        drift, reward_gap, mismatched, final_kept, episodes = [], [], [], True, [[], []]
        for _ in range(-(-limit // chunk) + 1):  # one chunk into the second episode
            actions = rng.uniform(low, high, (num_envs, chunk, spec.action_dim)).astype(np.float32)
            results = [reference.step(actions), candidate.step(actions)]
            for key in ("terminated", "truncated", "executed_steps"):
                if not np.array_equal(getattr(results[0], key), getattr(results[1], key)):
                    mismatched.append(key)
            done = results[1].done
            if not episodes[0]:  # the first episodes; later ones start from each side's own reset seeds
                reward_gap.append(float(np.abs(results[0].reward - results[1].reward).max()))
                ends = [np.where(r.done[:, None], r.final_observation.state, r.observation.state) for r in results]
                drift.append(float(np.abs(ends[0] - ends[1]).max()))
            if done.any():  # the ended episode's last observation is kept apart from the new one's first
                final = results[1].final_observation.state[done]
                final_kept &= not np.allclose(final, results[1].observation.state[done])
            for side, result in enumerate(results):
                episodes[side] += [(e.env_id, e.length) for e in result.episodes]
        return {
            "task": task,
            "num_envs": num_envs,
            "chunk": chunk,
            "limit": limit,
            "reset_max_abs_diff": float(np.abs(first[0] - first[1]).max()),
            "first_episode_state_drift": max(drift),
            "first_episode_reward_gap": max(reward_gap),
            "flags_mismatched": sorted(set(mismatched)),
            "final_observation_kept": bool(final_kept),
            "episodes_reference": sorted(episodes[0]),
            "episodes_candidate": sorted(episodes[1]),
            "truncated_at_limit": all(length == limit for _, length in episodes[1]) and len(episodes[1]) == num_envs,
        }
    finally:
        reference.close()
        candidate.close()


def correctness(scale: Scale, work: Path) -> StepResult:
    require_physx_gpu(scale)
    rows = [
        measure("compare_envs", task=task, num_envs=scale.sizes(64)[0], sim_backend=scale.sim_backend, chunk=5, seed=3)
        for task in ("PushCube-v1", "PickCube-v1")
    ]
    ok = [
        r["reset_max_abs_diff"] < 1e-4
        and not r["flags_mismatched"]
        and r["final_observation_kept"]
        and r["truncated_at_limit"]
        and r["episodes_reference"] == r["episodes_candidate"]
        for r in rows
    ]
    return StepResult(
        "same seeds give the same first state (< 1e-4); chunked steps end, truncate and auto-reset where the CPU "
        "env does, keeping the final observation",
        all(ok),
        rows,
        [
            "the first episode's state drift and reward gap measure how far GPU and CPU physics part under the "
            "same random actions: reported, not judged (on one backend, as with --smoke, they are zero)"
        ],
    )


# ---- 2. throughput: our batched env against ManiSkill's own stepping ----------------------------
def env_rates(task: str, num_envs: int, obs_mode: str, sim_backend: str, steps: int) -> dict[str, Any]:
    import torch

    from embodied.sim.maniskill_batched import ManiSkillBatchedEnv
    from embodied.sim.maniskill_common import ManiSkillConfig, flatten_state, make_gym_env

    config = ManiSkillConfig(task=task, num_envs=num_envs, obs_mode=obs_mode)
    raw = make_gym_env(config, num_envs, sim_backend)
    raw.reset(seed=0)
    device = raw.unwrapped.device
    action = torch.rand((num_envs, *raw.unwrapped.single_action_space.shape), device=device) * 2 - 1
    for _ in range(3):
        observation, *_ = raw.step(action)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        observation, *_ = raw.step(action)
    synchronize()
    raw_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(steps):
        flatten_state(observation)
    to_host_s = time.perf_counter() - started
    raw.close()
    ours = ManiSkillBatchedEnv(config, base_seed=0, sim_backend=sim_backend)
    actions = np.random.default_rng(0).uniform(-1, 1, (num_envs, 1, ours.spec.action_dim)).astype(np.float32)
    for _ in range(3):
        ours.step(actions)
    started = time.perf_counter()
    for _ in range(steps):
        ours.step(actions)
    ours_s = time.perf_counter() - started
    ours.close()
    return {
        "task": task,
        "obs_mode": obs_mode,
        "num_envs": num_envs,
        "steps": steps,
        "raw_steps_per_s": num_envs * steps / raw_s,
        "ours_steps_per_s": num_envs * steps / ours_s,
        "ratio": raw_s / ours_s,
        "state_to_host_share": to_host_s / raw_s,
    }


def throughput(scale: Scale, work: Path) -> StepResult:
    require_physx_gpu(scale)
    steps = 3 if scale.smoke else 100
    rows = [
        measure(
            "env_rates", task="PushCube-v1", num_envs=n, obs_mode="state", sim_backend=scale.sim_backend, steps=steps
        )
        for n in scale.sizes(256, 1024, 4096)
    ]
    rows += [
        measure("env_rates", task="PushCube-v1", num_envs=n, obs_mode="rgb", sim_backend=scale.sim_backend, steps=steps)
        for n in scale.sizes(64, 256)
    ]
    host = max(r["state_to_host_share"] for r in rows)
    notes = [
        f"copying observations to the host costs up to {host:.0%} of a raw step"
        + (": above 10%, keep them on the GPU through the local runtime (the issue's rule)" if host > 0.1 else "")
    ]
    return StepResult(
        "our batched env steps at >= 0.9x ManiSkill's raw GPU stepping (a cheap policy)",
        all(r["ratio"] >= 0.9 for r in rows),
        rows,
        notes,
    )


# ---- 3. learning speed: PPO from state with physx_cuda ------------------------------------------
PPO_RUNS = {  # ManiSkill's published PPO baselines' settings (examples/baselines/ppo)
    "PushCube-v1": {"num_envs": 2048, "rollout_steps": 20, "total": 2_000_000, "published": "< 1 min"},
    "PickCube-v1": {"num_envs": 1024, "rollout_steps": 50, "total": 10_000_000, "published": "2-5 min"},
}


def ppo(scale: Scale, work: Path) -> StepResult:
    require_physx_gpu(scale)
    rows = []
    for task, run in PPO_RUNS.items():
        env = f"env=maniskill_{task.split('-')[0].lower()}"
        num_envs, total, rollout = (1, 4, 2) if scale.smoke else (run["num_envs"], run["total"], run["rollout_steps"])
        run_dir = work / f"ppo-{task}"
        embodied(
            "train",
            env,
            f"env.backend={scale.env_backend}",
            f"env.num_envs={num_envs}",
            "env.num_workers=0",
            f"algo.rollout_steps={rollout}",
            f"algo.num_minibatches={1 if scale.smoke else 32}",
            "algo.update_epochs=8",
            f"total_env_steps={total}",
            f"runtime.device={scale.device}",
            "eval_every=0",
            "eval_episodes=0",
            f"checkpoint_every={2 if scale.smoke else 5}",
            "keep_checkpoints=1000",
            f"time_limit_s={60 if scale.smoke else 480}",
            "logger.progress_bar=false",
            f"run_dir={run_dir}",
            cwd=work,
            timeout=900,
        )
        curve = checkpoint_successes(run_dir, env, scale, work)
        reached = next(((steps, seconds) for steps, seconds, success in curve if success >= 0.9), None)
        rows.append(
            {
                "task": task,
                "num_envs": num_envs,
                "curve": curve,
                "published": run["published"],
                "env_steps_to_90": reached[0] if reached else None,
                "seconds_to_90": reached[1] if reached else None,
            }
        )
    return StepResult(
        ">= 90% deterministic success, in wall time beside ManiSkill's published PPO baseline",
        all(r["env_steps_to_90"] is not None for r in rows),
        rows,
        [
            "success: each checkpoint evaluated afterwards on CPU envs (16 workers, 64 episodes), so "
            "evaluation never shares the GPU scene"
        ],
    )


def checkpoint_successes(run_dir: Path, env: str, scale: Scale, work: Path) -> list[tuple[int, float, float]]:
    """(env steps, training seconds, deterministic success) of every checkpoint of a run,
    each evaluated on CPU envs (`env`, the run's env option)."""
    from embodied.checkpoint import load_checkpoint_state

    curve = []
    for checkpoint in sorted((run_dir / "checkpoints").glob("iter_*")):
        state = load_checkpoint_state(checkpoint)
        episodes, workers = (1, 0) if scale.smoke else (64, 16)
        output = work / "eval" / run_dir.name / checkpoint.name
        embodied(
            "eval",
            f"checkpoint={checkpoint}",
            env,
            "env.backend=cpu",
            f"env.num_envs={max(workers, 1)}",
            f"env.num_workers={workers}",
            f"episodes={episodes}",
            f"output={output}",
            "progress_bar=false",
            cwd=work,
            timeout=600,
        )
        report = json.loads((output / "report.json").read_text())
        curve.append((int(state["env_steps"]), float(state.get("elapsed_s", 0.0)), report["overall"]["success_rate"]))
    return curve


# ---- 4. the built-in VLA from pixels and language: SFT, then Flow-SDE PPO ------------------------
# PickCube from its camera: the multi-task env cannot give one policy the same cameras (StackCube adds
# a hand camera) and a physx_cuda scene holds one task.
VLA_ENV = ["env=maniskill_pickcube", "env.obs_mode=rgb", "env.control_mode=pd_ee_delta_pos"]


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
                f"root={demos}",
                cwd=work_dir,
                timeout=7200,
            )
        embodied(
            "sft",
            f"dataset={demos}",
            *VLA_ENV,
            *small,
            "policy=flow_vla",
            f"device={device}",
            f"steps={2 if smoke else 4000}",
            f"eval_episodes={3 if smoke else 144}",
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
    from embodied.checkpoint import load_checkpoint_state

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
        f"eval_episodes={(3 if scale.smoke else 144) if final else 0}",
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
def pipeline_rates(workers: int, num_envs: int, steps: int, device: str, depths: list[int]) -> dict[str, Any]:
    import torch
    from pipeline import pipelining_bound, rollout_rates, seconds_per_call, stage_step  # sibling script

    from embodied.policies.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.sim.maniskill import make_maniskill
    from embodied.sim.maniskill_common import ManiSkillConfig

    started = time.time()
    env = make_maniskill(ManiSkillConfig(task="PushCube-v1", num_envs=num_envs, num_workers=workers), seed=0)
    log(f"pipeline: {workers} workers, {num_envs} envs built in {time.time() - started:.0f} s")
    try:
        zeros = np.zeros((num_envs, 1, env.spec.action_dim), np.float32)
        step_s = seconds_per_call(lambda: env.step(zeros), repeats=5)
        stages = env.num_stages  # the workers that hold envs
        stage_s = float(np.mean([seconds_per_call(lambda k=k: stage_step(env, k, zeros), 5) for k in range(stages)]))
        observation = env.reset().to_torch(device)
        # A policy whose inference lasts about one env step, where pipelining pays most. On a
        # GPU a small batch's inference is bound by kernel launches, not by width, so the
        # ladder is in depth; built on the device, as CPU initialisation of big layers is slow.
        for depth in depths:
            with torch.device(device):
                policy = MLPGaussianPolicy(MLPPolicyConfig(actor_hidden=[1024] * depth, critic_hidden=[256]), env.spec)
            with torch.no_grad():
                inference_s = seconds_per_call(lambda policy=policy: policy.act(observation), repeats=5)
            log(f"pipeline: depth {depth}: inference {1e3 * inference_s:.1f} ms, env step {1e3 * step_s:.1f} ms")
            if inference_s >= step_s:
                break
        rates = rollout_rates(env, policy, steps, device)
    finally:
        env.close()
    return {
        "workers": workers,
        "num_envs": num_envs,
        "env_step_ms": 1e3 * step_s,
        "stage_step_ms": 1e3 * stage_s,
        "inference_ms": 1e3 * inference_s,
        "depth": depth,
        **rates,
        "speedup": rates["pipelined"] / rates["sequential"],
        "bound": pipelining_bound(step_s, stage_s, inference_s, stages),
    }


def pipeline(scale: Scale, work: Path) -> StepResult:
    rows = []
    for w in [2] if scale.smoke else [4, 8, 16]:
        try:
            rows.append(
                measure(
                    "pipeline_rates",
                    workers=w,
                    num_envs=1 if scale.smoke else 4 * w,
                    steps=2 if scale.smoke else 40,
                    device=scale.device,
                    depths=[2] if scale.smoke else [8, 32, 128, 256, 512, 1024, 2048],
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
            "bound: the best ratio the row's own stage times allow (benchmarks/pipeline.py), which "
            "takes inference to shrink with the rows inferred; a GPU's small-batch inference does "
            "not, so a stage's share costs nearly the whole batch's and the bound is optimistic"
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


PLACEMENTS = ("disaggregated", "collocated")


def placement(scale: Scale, work: Path) -> StepResult:
    from placement import run  # sibling script

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
    ]
    # each run is given 4 minutes on a GPU: a call lasts 10, and the log says how far one got
    rows = []
    for name in PLACEMENTS:
        rows.append(run(name, 1 if scale.smoke else 3, overrides, None if scale.smoke else 240))
        on_measured(rows[-1])
    return StepResult(
        "collocated needs less peak GPU memory than disaggregated; the cost is the offload time",
        None if scale.smoke else rows[1]["device_peak_gb"] < rows[0]["device_peak_gb"],
        rows,
    )


# ---- 7. offscreen rendering: EGL on the GPU against CPU rendering ---------------------------------
SCENE = """<mujoco><worldbody><light pos="0 0 3"/><geom type="plane" size="1 1 .1"/>
<body pos="0 0 .1"><freejoint/><geom type="box" size=".05 .05 .05" rgba="1 0 0 1"/></body>
<camera name="agentview" pos="0 -1 1" xyaxes="1 0 0 0 .7 .7"/><camera name="wrist" pos=".3 0 .5"
xyaxes="0 1 0 -.7 0 .7"/></worldbody></mujoco>"""


def render_rate(backend: str, size: int, frames: int) -> dict[str, Any]:
    os.environ["MUJOCO_GL"] = backend
    import mujoco

    if not hasattr(mujoco, "Renderer"):  # mujoco leaves it out, silently, when its GL bindings fail to import
        import OpenGL  # noqa: F401  (PyOpenGL, the usual cause: its import error names it)

        raise RuntimeError(f"mujoco {mujoco.__version__} offers no Renderer with MUJOCO_GL={backend}")
    model = mujoco.MjModel.from_xml_string(SCENE)
    data = mujoco.MjData(model)
    renderer = mujoco.Renderer(model, size, size)
    started = time.perf_counter()
    for _ in range(frames):
        mujoco.mj_step(model, data)
        for camera in ("agentview", "wrist"):
            renderer.update_scene(data, camera)
            renderer.render()
    return {"backend": backend, "size": size, "steps_per_s": frames / (time.perf_counter() - started)}


def rendering(scale: Scale, work: Path) -> StepResult:
    rows, notes = (
        [],
        [
            "LIBERO itself cannot travel to the GPU machine (its mujoco 2.3.7 has no Python 3.12 build, "
            "its assets are 622 MB): this renders LIBERO's two 128 px cameras on a small MuJoCo scene"
        ],
    )
    for backend in ("egl", "osmesa"):
        try:
            rows.append(measure("render_rate", backend=backend, size=128, frames=5 if scale.smoke else 500))
        except RuntimeError as error:
            notes.append(f"{backend}: unavailable ({str(error).splitlines()[-1][:200]})")
    return StepResult(
        "steps/s with both cameras rendered through EGL, beside CPU rendering where it runs", None, rows, notes
    )


# ---- 8. OpenVLA-7B from the published layout: load, rollout and GRPO with LoRA --------------------
def openvla(scale: Scale, work: Path) -> StepResult:
    import shutil

    import torch
    from openvla_real_size import SIZES, save_random_checkpoint  # sibling script
    from openvla_real_size import measure as measure_openvla

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


MEASUREMENTS = {
    "vla_sft": vla_sft,
    "compare_envs": compare_envs,
    "env_rates": env_rates,
    "pipeline_rates": pipeline_rates,
    "render_rate": render_rate,
}

if __name__ == "__main__":
    name, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(MEASUREMENTS[name](**arguments)))
