"""How much signal one batch of rollouts carries for the policy gradient of a token VLA.

From a checkpoint (default: the SFT run of `multitask_vla.py`), collect `--batches` grouped
batches on its env (24 envs, groups of 4 from one initial state, one 50-step episode each,
sampled at each `--temperature`), and compute each batch's policy gradient under several
advantage estimators:

  grpo-success   GRPO: success normalised within its group, over the whole episode
  grpo-return    GRPO on the episode's return
  ppo-lambda-L   PPO's GAE (gamma 0.8, lambda L) on the dense reward, with an MLP critic on
                 the state fitted to the batches' discounted returns (explained variance shown)
  ppo-success    PPO's GAE (gamma 0.99, lambda 0.95) on the success reward (1 at each step the
                 task is solved), as the PPO arm of multitask_vla.py trains, with its own critic

For gradients g_1..g_n of n batches, |E g|^2 is estimated without bias by the mean of the
off-diagonal dot products g_i . g_j and the noise by the mean |g_i|^2 minus that; their
ratio is the per-batch squared signal-to-noise ratio SNR^2, and 1 / SNR^2 the number of
batches whose average gradient points the right way as much as it points at noise.

    python benchmarks/gradient_snr.py                       # SFT policy of multitask_vla.py
    python benchmarks/gradient_snr.py --checkpoint runs/... --batches 32 --temperature 1 2
    (a run adds its temperatures to the summary's when the checkpoint and batches are the same)
    python benchmarks/gradient_snr.py report                # rebuild the summary"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from harness.reports import save_with_summary
from harness.runs import RESULTS, RUNS

ROOT = Path(__file__).resolve().parents[1]
GROUP_SIZE = 4
NUM_ENVS = 24
EPISODE_STEPS = 50
GAMMA = 0.8
LAMBDAS = (0.0, 0.5, 0.9)
SUCCESS_GAMMA, SUCCESS_LAMBDA = 0.99, 0.95  # the multitask PPO arm's (configs/experiment/multitask_token_vla_ppo.yaml)
SUMMARY = RESULTS / "gradient_snr.json"
SFT = RUNS / "multitask-sft-h128-s4"  # multitask_vla.py's SFT run, by its folder: the default checkpoint


def load_policy(checkpoint: Path, temperature: float):
    from embodied.build import build_policy
    from embodied.config import checkpoint_config
    from embodied.core.types import EnvSpec
    from embodied.runs.checkpoint import load_checkpoint, load_policy_weights

    config = checkpoint_config(checkpoint)
    weights, saved = load_checkpoint(checkpoint)
    policy = build_policy(
        replace(config.policy, temperature=temperature), EnvSpec.from_dict(saved["spec"]), torch.device("cpu")
    )
    load_policy_weights(policy, weights, saved)
    return policy, config.env


def collect(policy, env_config, temperature: float, batches: int) -> list:
    from embodied.build import build_env
    from embodied.runtime.rollout import Rollout

    env = build_env(replace(env_config, num_envs=NUM_ENVS, num_workers=2), seed=5)
    rollout = Rollout(env, policy, torch.device("cpu"), seed=5)
    collected, started = [], time.perf_counter()
    try:
        for round_index in range(batches):
            rollout.start_groups(GROUP_SIZE, round_index, base_seed=5)
            trajectory, _, _ = rollout.collect(EPISODE_STEPS)
            collected.append(trajectory)
            print(
                f"T={temperature}: batch {round_index + 1}/{batches}, success "
                f"{trajectory.success.any(0).float().mean():.2f} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    finally:
        env.close()
    return collected


def policy_gradient(policy, trajectory, step_advantage: torch.Tensor) -> torch.Tensor:
    """Gradient of the token-mean policy-gradient loss for (T, B) advantages."""
    rows = torch.arange(trajectory.num_steps * trajectory.num_envs)
    policy.zero_grad()
    evaluation = policy.recompute(trajectory.flat_observation(rows), trajectory.chunk(rows))
    advantage = step_advantage.reshape(-1)[:, None].to(evaluation.term_log_prob.dtype)
    (-(evaluation.term_log_prob * advantage).mean()).backward()
    return torch.cat([p.grad.reshape(-1) for p in policy.parameters() if p.grad is not None]).clone()


def step_reward(trajectory, estimator: str) -> torch.Tensor:
    """The dense reward the batches were collected with, or the success reward (ManiSkill's sparse)."""
    return trajectory.success.float() if estimator == "ppo-success" else trajectory.reward


def fit_state_critic(trajectories: list, estimator: str, gamma: float) -> tuple:
    """An MLP on the state fitted to the discounted returns of all batches."""
    from torch import nn

    from embodied.algos.advantages import explained_variance, gae

    states, returns = [], []
    for trajectory in trajectories:
        reward = step_reward(trajectory, estimator)
        zeros = torch.zeros_like(reward)
        # with values of 0 and lambda 1, GAE's returns are the discounted returns-to-go
        _, discounted = gae(reward, zeros, trajectory.terminated, trajectory.truncated, zeros, zeros[-1], gamma, 1.0)
        states.append(trajectory.observation.state.reshape(-1, trajectory.observation.state.shape[-1]))
        returns.append(discounted.reshape(-1))
    x, y = torch.cat(states).float(), torch.cat(returns).float()
    torch.manual_seed(0)  # the critic's init: across inits PPO's SNR^2 moved 0.033-0.038 at T=1, 0.03-0.11 at T=2
    mean, std = x.mean(0), x.std(0) + 1e-6
    net = nn.Sequential(nn.Linear(x.shape[1], 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1))
    optimizer = torch.optim.Adam(net.parameters(), 1e-3)
    for _ in range(1500):
        index = torch.randint(0, len(x), (512,))
        loss = ((net((x[index] - mean) / std).squeeze(-1) - y[index]) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        explained = explained_variance(net((x - mean) / std).squeeze(-1), y)
    return (lambda state: net((state.float() - mean) / std).squeeze(-1)), explained


def advantages(trajectory, estimator: str, critics: dict) -> torch.Tensor:
    from embodied.algos.advantages import gae, group_normalized

    groups = torch.arange(trajectory.num_envs) // GROUP_SIZE
    if estimator.startswith("grpo"):
        outcome = trajectory.success.any(0).float() if estimator == "grpo-success" else trajectory.reward.sum(0)
        return group_normalized(outcome, groups)[None].expand(trajectory.num_steps, -1)
    success = estimator == "ppo-success"
    gamma, lam = (SUCCESS_GAMMA, SUCCESS_LAMBDA) if success else (GAMMA, float(estimator.removeprefix("ppo-lambda-")))
    critic = critics["success" if success else "dense"]
    reward = step_reward(trajectory, estimator)
    with torch.no_grad():
        value = critic(trajectory.observation.state)
        last = critic(trajectory.next_state[-1])
    bootstrap = torch.zeros_like(reward) + last  # the episode is cut at its time limit after the last step
    advantage, _ = gae(reward, value, trajectory.terminated, trajectory.truncated, bootstrap, last, gamma, lam)
    return (advantage - advantage.mean()) / (advantage.std() + 1e-8)


def signal_to_noise(gradients: list[torch.Tensor]) -> dict:
    g = torch.stack(gradients).double()
    n = len(gradients)
    dots = g @ g.T
    signal = float((dots.sum() - dots.diag().sum()) / (n * (n - 1)))  # unbiased |E g|^2
    noise = float(dots.diag().mean()) - signal
    return {"snr2_per_batch": signal / noise, "batches_for_snr_1": noise / signal if signal > 0 else None}


def measure(checkpoint: Path, temperatures: list[float], batches: int) -> dict:
    torch.manual_seed(0)
    results = {}
    for temperature in temperatures:
        policy, env_config = load_policy(checkpoint, temperature)
        trajectories = collect(policy, env_config, temperature, batches)
        policy.train()
        dense_critic, explained = fit_state_critic(trajectories, "dense", GAMMA)
        success_critic, success_explained = fit_state_critic(trajectories, "ppo-success", SUCCESS_GAMMA)
        critics = {"dense": dense_critic, "success": success_critic}
        row = {
            "success": float(torch.stack([t.success.any(0).float().mean() for t in trajectories]).mean()),
            "critic_explained_variance": explained,
            "success_critic_explained_variance": success_explained,
            "estimators": {},
        }
        for estimator in ("grpo-success", "grpo-return", *(f"ppo-lambda-{lam:g}" for lam in LAMBDAS), "ppo-success"):
            gradients = [policy_gradient(policy, t, advantages(t, estimator, critics)) for t in trajectories]
            row["estimators"][estimator] = signal_to_noise(gradients)
            print(
                f"T={temperature} {estimator}: SNR^2 per batch {row['estimators'][estimator]['snr2_per_batch']:.4f}",
                flush=True,
            )
        results[f"{temperature:g}"] = row
    return results


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = json.loads(SUMMARY.read_text())
    temperatures = list(summary["by_temperature"])
    estimators = list(dict.fromkeys(e for row in summary["by_temperature"].values() for e in row["estimators"]))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(temperatures)
    for k, temperature in enumerate(temperatures):
        measured = summary["by_temperature"][temperature]["estimators"]
        values = [measured[e]["snr2_per_batch"] if e in measured else float("nan") for e in estimators]
        ax.bar([i + k * width for i in range(len(estimators))], values, width, label=f"temperature {temperature}")
    ax.set_xticks([i + width * (len(temperatures) - 1) / 2 for i in range(len(estimators))], estimators, fontsize=8)
    ax.set_ylabel(f"SNR^2 of one batch ({NUM_ENVS} episodes)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Policy-gradient signal per batch, token VLA after SFT (3 ManiSkill tasks)")
    save_with_summary(fig, RESULTS, "gradient_snr", summary)
    lines = [
        "# Policy-gradient signal-to-noise of one batch",
        "",
        f"Checkpoint `{summary['checkpoint']}`; {summary['batches']} batches of {NUM_ENVS} episodes (groups of "
        f"{GROUP_SIZE} from one initial state, {EPISODE_STEPS} steps). SNR^2: |mean gradient|^2 over the "
        "variance of one batch's gradient (unbiased, from the pairwise dot products); 1 / SNR^2 batches "
        "average to SNR 1; a negative estimate means no signal measurable above the noise of this many batches. "
        "PPO's critics: MLPs on the state fitted to the same batches' returns, dense (gamma 0.8) and success "
        "(gamma 0.99); EV: the fraction of the return's variance each explains.",
        "",
        "| temperature | sampled success | dense critic EV | success critic EV | " + " | ".join(estimators) + " |",
        "| ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in estimators) + " |",
    ]
    for temperature, row in summary["by_temperature"].items():
        cells = [f"{row['estimators'][e]['snr2_per_batch']:.4f}" if e in row["estimators"] else "-" for e in estimators]
        success_ev = row.get("success_critic_explained_variance")
        lines.append(
            f"| {temperature} | {row['success']:.2f} | {row['critic_explained_variance']:.2f} | "
            f"{'-' if success_ev is None else f'{success_ev:.2f}'} | " + " | ".join(cells) + " |"
        )
    lines += ["", "![SNR](gradient_snr.png)"]
    (RESULTS / "gradient_snr.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / "gradient_snr.md").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="run", choices=("run", "report"))
    parser.add_argument("--checkpoint", default=str(SFT))
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--temperature", type=float, nargs="+", default=[1.0, 2.0])
    args = parser.parse_args()
    if args.command == "run":
        from embodied.runs.checkpoint import resolve_checkpoint

        torch.set_num_threads(1)  # the env workers take the other core
        checkpoint = resolve_checkpoint(args.checkpoint)
        summary = {
            "checkpoint": str(
                Path(args.checkpoint).resolve().relative_to(ROOT)
                if Path(args.checkpoint).resolve().is_relative_to(ROOT)
                else args.checkpoint
            ),
            "batches": args.batches,
            "by_temperature": {},
        }
        if SUMMARY.is_file():  # temperatures measured before on the same checkpoint and batches stay
            earlier = json.loads(SUMMARY.read_text())
            if (earlier["checkpoint"], earlier["batches"]) == (summary["checkpoint"], summary["batches"]):
                summary["by_temperature"] = earlier["by_temperature"]
        summary["by_temperature"].update(measure(checkpoint, args.temperature, args.batches))
        summary["by_temperature"] = dict(sorted(summary["by_temperature"].items(), key=lambda item: float(item[0])))
        SUMMARY.write_text(json.dumps(summary, indent=2))
    report()


if __name__ == "__main__":
    main()
