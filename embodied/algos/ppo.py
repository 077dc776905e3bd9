"""PPO with GAE, clipped ratio, optional value clipping, entropy bonus, advantage
normalisation; approx_kl, clipfrac and explained_variance logged beside the losses.

What the ratio is taken over (`ratio`: the chunk, or each term of it) and the advantage each
term gets are `policy_gradient`'s, shared with GRPO. The per-term losses are averaged over all
terms."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import nn

from embodied.algos.advantages import explained_variance, gae
from embodied.algos.buffers import Trajectory
from embodied.algos.distributed import DataParallel
from embodied.algos.policy_gradient import (
    LossAverages,
    check_ratio,
    minibatch_order,
    optimizer_step,
    ratio_log_probs,
    recompute_rows,
    term_advantages,
)
from embodied.algos.reward_scaling import ReturnScaler
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.registry import ALGOS


@dataclass
class PPOConfig:
    name: str = "ppo"
    rollout_steps: int = 2048  # env (chunk) steps per env per iteration
    lr: float = 3e-4
    anneal_lr: bool = True
    adam_eps: float = 1e-5
    gamma: float = 0.99  # discount per env step of the policy, i.e. per executed action chunk
    gae_lambda: float = 0.95
    update_epochs: int = 10
    num_minibatches: int = 32
    clip_coef: float = 0.2
    clip_value_loss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    normalize_advantages: bool = True
    target_kl: Optional[float] = None  # stop the epoch loop early above this approx_kl
    scale_reward: bool = True  # divide rewards by the running std of the discounted return
    reward_clip: float = 10.0
    # Decoupled PPO for samples from an older policy (asynchronous training): the ratio is
    # clipped around the policy at the start of the update, and each sample is reweighted by
    # that policy over the one that acted, capped here.
    behaviour_weight_cap: float = 5.0
    # Iterations at the start that train only the value function, so a pretrained policy
    # (e.g. a VLA after SFT) is not pushed around by advantages from an untrained critic.
    critic_warmup_iterations: int = 0
    # The value function's own learning rate (annealed like `lr`); None: `lr`. A value head
    # on a pretrained policy (e.g. a token VLA) needs far more than the small steps that keep
    # the policy near its SFT weights. Its own optimizer parameter group, whose gradient norm
    # is clipped on its own (`loss/value_grad_norm`).
    value_lr: Optional[float] = None
    # Dual clip (> 1, e.g. 3): for negative advantages the loss is also capped at -c * A, so a
    # huge ratio on a bad action cannot dominate the batch. None: off.
    dual_clip: Optional[float] = None
    value_loss: str = "mse"  # mse | huber (less sensitive to outlier returns, e.g. sparse success)
    huber_delta: float = 10.0
    # Split each minibatch (each rank's shard of it) into this many equal parts whose
    # gradients add up before the step: the same step with a fraction of the activation memory.
    gradient_accumulation_steps: int = 1
    ratio: str = "chunk"  # chunk | term (see the module docstring)
    denoise_discount: float = 1.0  # DPPO's gamma_denoise, with ratio=term


@dataclass
class PPOLoss:
    total: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor


def ppo_loss(
    new_log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    new_value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    cfg: PPOConfig,
    behaviour_weight: Optional[torch.Tensor] = None,
) -> PPOLoss:
    """`old_log_prob` is the policy the ratio is clipped around. In decoupled PPO that is the
    proximal policy, and `behaviour_weight` = pi_proximal / pi_behaviour corrects for the
    older policy that collected the samples. The policy terms (log-probs, advantages, weights)
    are (B,) or (B, P) with one ratio per term; values and returns are (B,)."""
    log_ratio = new_log_prob - old_log_prob
    ratio = log_ratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # the low-variance k3 estimator
        clipfrac = ((ratio - 1).abs() > cfg.clip_coef).float().mean()

    if cfg.normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    per_sample = torch.max(
        -advantages * ratio,
        -advantages * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef),
    )
    if cfg.dual_clip is not None:
        per_sample = torch.where(advantages < 0, torch.min(per_sample, -cfg.dual_clip * advantages), per_sample)
    policy_loss = (per_sample if behaviour_weight is None else behaviour_weight * per_sample).mean()

    def error(value: torch.Tensor) -> torch.Tensor:
        if cfg.value_loss == "huber":
            return nn.functional.huber_loss(value, returns, reduction="none", delta=cfg.huber_delta)
        return 0.5 * (value - returns) ** 2

    if cfg.clip_value_loss:
        clipped_value = old_value + (new_value - old_value).clamp(-cfg.clip_coef, cfg.clip_coef)
        value_loss = torch.max(error(new_value), error(clipped_value)).mean()
    else:
        value_loss = error(new_value).mean()

    entropy = entropy.mean()
    total = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
    return PPOLoss(total, policy_loss, value_loss, entropy, approx_kl, clipfrac)


def check_config(cfg: PPOConfig) -> None:
    for key in ("rollout_steps", "num_minibatches", "update_epochs", "gradient_accumulation_steps"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"algo.{key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("gamma", "gae_lambda"):
        if not 0.0 <= getattr(cfg, key) <= 1.0:
            raise ConfigError(f"algo.{key} must be in [0, 1], got {getattr(cfg, key)}")
    for key in ("lr", "clip_coef", "max_grad_norm", "reward_clip", "behaviour_weight_cap", "huber_delta"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"algo.{key} must be > 0, got {getattr(cfg, key)}")
    if cfg.value_lr is not None and cfg.value_lr <= 0:
        raise ConfigError(f"algo.value_lr must be > 0 (or null), got {cfg.value_lr}")
    if cfg.dual_clip is not None and cfg.dual_clip <= 1:
        raise ConfigError(f"algo.dual_clip must be > 1 (or null), got {cfg.dual_clip}")
    if cfg.value_loss not in ("mse", "huber"):
        raise ConfigError(f"algo.value_loss must be 'mse' or 'huber', got '{cfg.value_loss}'")
    check_ratio(cfg.ratio, cfg.denoise_discount)


def parameter_groups(policy: Policy, cfg: PPOConfig) -> list[dict]:
    """The optimizer's parameter groups: one, or with `value_lr` the value function's apart
    (marked `value`, so the learning rate can be set per group)."""
    if cfg.value_lr is None:
        return [{"params": list(policy.parameters())}]
    value = {id(p) for p in policy.value_parameters()}
    return [
        {"params": [p for p in policy.parameters() if id(p) not in value]},
        {"params": [p for p in policy.parameters() if id(p) in value], "lr": cfg.value_lr, "value": True},
    ]


@dataclass
class UpdateTargets:
    """What an iteration's minibatches are fitted to: the returns, the log-probs the ratio is
    clipped around (the behaviour policy's, or in decoupled PPO the proximal one's, with
    `behaviour_weight` correcting for the older collector), and which parameters learn (during
    the critic warm-up only the value's: `frozen` are the others, whose gradients are dropped)."""

    returns: torch.Tensor  # (N,)
    old_log_prob: torch.Tensor  # (N, P)
    behaviour_weight: Optional[torch.Tensor]  # (N, P) or None
    warming_up: bool
    parameters: list[torch.Tensor]
    frozen: list[torch.Tensor]


class PPO:
    def __init__(self, cfg: PPOConfig, policy: Policy):
        check_config(cfg)
        self.cfg = cfg
        self.policy = policy
        self.optimizer = torch.optim.Adam(parameter_groups(policy, cfg), lr=cfg.lr, eps=cfg.adam_eps)
        self.return_scaler = ReturnScaler(cfg.gamma, cfg.reward_clip) if cfg.scale_reward else None
        self.iterations = 0
        # Advantages are normalised over the whole minibatch before it is sharded, so each
        # rank's loss needs no normalisation of its own.
        self._loss_cfg = replace(cfg, normalize_advantages=False)
        self.data_parallel: DataParallel | None = None  # set on every learner rank of a data-parallel run

    def update(self, batch: Trajectory, progress: float, off_policy: bool = False) -> dict[str, float]:
        """One PPO iteration on a collected batch; `progress` in [0, 1) anneals the lr.
        `off_policy`: the batch came from an older policy than this one (decoupled PPO)."""
        cfg, parallel = self.cfg, self.data_parallel
        scale = self._anneal(progress)
        advantages, returns = self._advantages(batch)
        size = advantages.numel()
        minibatch = size // cfg.num_minibatches
        if minibatch < 2:
            raise ConfigError(
                f"a batch of {size} samples (envs x algo.rollout_steps) cannot be split into "
                f"algo.num_minibatches={cfg.num_minibatches} minibatches of at least 2"
            )
        targets = self._targets(batch, returns, minibatch, off_policy)
        averages = LossAverages()
        shard = parallel.shard(minibatch) if parallel else slice(None)
        for _ in range(cfg.update_epochs):
            order = minibatch_order(size, parallel)
            for start in range(0, size - minibatch + 1, minibatch):
                rows = order[start : start + minibatch]
                picked = advantages[rows]
                if cfg.normalize_advantages:
                    picked = (picked - picked.mean()) / (picked.std() + 1e-8)
                losses = self._step(batch, rows[shard], picked[shard], targets, averages)
            kl = sum(float(part.approx_kl) for part in losses) / len(losses)  # the whole minibatch's
            if cfg.target_kl is not None and (parallel.mean(kl) if parallel else kl) > cfg.target_kl:
                break

        metrics = averages.metrics()
        metrics["loss/explained_variance"] = explained_variance(batch.value.reshape(-1), returns)
        metrics["train/lr"] = cfg.lr * scale
        if cfg.value_lr is not None:
            metrics["train/value_lr"] = cfg.value_lr * scale
        metrics["train/advantage_mean"] = float(advantages.mean())
        if targets.behaviour_weight is not None:
            metrics["loss/behaviour_weight"] = float(targets.behaviour_weight.mean())
        metrics["train/critic_warmup"] = float(targets.warming_up)
        self.iterations += 1
        return metrics

    def _anneal(self, progress: float) -> float:
        """Sets each parameter group's learning rate for this iteration; returns the scale."""
        cfg = self.cfg
        scale = 1.0 - progress if cfg.anneal_lr else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = (cfg.value_lr if group.get("value") else cfg.lr) * scale
        return scale

    def _advantages(self, batch: Trajectory) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and returns, flat over (step, env), of the (scaled) rewards."""
        cfg = self.cfg
        done = batch.terminated | batch.truncated
        reward = self.return_scaler(batch.reward, done) if self.return_scaler else batch.reward
        advantages, returns = gae(
            reward,
            batch.value,
            batch.terminated,
            batch.truncated,
            batch.bootstrap_value,
            batch.last_value,
            cfg.gamma,
            cfg.gae_lambda,
        )
        return advantages.reshape(-1), returns.reshape(-1)

    def _targets(self, batch: Trajectory, returns: torch.Tensor, minibatch: int, off_policy: bool) -> UpdateTargets:
        """What every minibatch of this iteration is fitted to (see `UpdateTargets`)."""
        cfg = self.cfg
        collected = batch.chunk(slice(None))
        behaviour_log_prob = ratio_log_probs(collected.log_prob, collected.record.get("term_log_prob"), cfg.ratio)
        old_log_prob, behaviour_weight = behaviour_log_prob, None
        if off_policy:
            old_log_prob = self._log_prob(batch, minibatch)  # the proximal policy: this one, now
            behaviour_weight = (old_log_prob - behaviour_log_prob).exp().clamp(max=cfg.behaviour_weight_cap)
        warming_up = self.iterations < cfg.critic_warmup_iterations
        parameters = list(self.policy.parameters())
        frozen = []
        if warming_up:  # a shared backbone under the value head stays as it is too
            value_parameters = {id(p) for p in self.policy.value_parameters()}
            frozen = [p for p in parameters if id(p) not in value_parameters]
        return UpdateTargets(returns, old_log_prob, behaviour_weight, warming_up, parameters, frozen)

    def _step(
        self,
        batch: Trajectory,
        rows: torch.Tensor,
        advantages: torch.Tensor,
        targets: UpdateTargets,
        averages: LossAverages,
    ) -> list[PPOLoss]:
        """One optimizer step on this rank's `rows` of a minibatch, in gradient-accumulation
        parts; returns each part's loss."""
        cfg = self.cfg
        self.optimizer.zero_grad()
        losses = []
        for part in self._accumulation_parts(len(rows)):
            part_rows = rows[part]
            recomputed, chunk, new_log_prob = recompute_rows(self.policy, batch, part_rows, cfg.ratio)
            part_advantages = term_advantages(advantages[part], new_log_prob.shape[1], cfg.denoise_discount)
            loss = ppo_loss(
                new_log_prob,
                targets.old_log_prob[part_rows],
                part_advantages,
                recomputed.value,
                chunk.value,
                targets.returns[part_rows],
                recomputed.entropy,
                self._loss_cfg,
                None if targets.behaviour_weight is None else targets.behaviour_weight[part_rows],
            )
            objective = cfg.vf_coef * loss.value_loss if targets.warming_up else loss.total
            (objective / cfg.gradient_accumulation_steps).backward()
            losses.append(loss)
        for parameter in targets.frozen:
            parameter.grad = None
        # with value_lr the value function is clipped on its own too, so a large value loss
        # does not scale the policy's gradient down
        clipped = [group["params"] for group in self.optimizer.param_groups]
        grad_norm, *value_norm = optimizer_step(
            self.optimizer, targets.parameters, clipped, cfg.max_grad_norm, self.data_parallel
        )
        for loss in losses:
            averages.add(loss, grad_norm, **({"value_grad_norm": value_norm[0]} if value_norm else {}))
        return losses

    def _accumulation_parts(self, size: int) -> list[slice]:
        steps = self.cfg.gradient_accumulation_steps
        if size % steps:
            raise ConfigError(
                f"a minibatch (shard) of {size} samples does not split into "
                f"algo.gradient_accumulation_steps={steps} equal parts"
            )
        part = size // steps
        return [slice(i * part, (i + 1) * part) for i in range(steps)]

    @torch.no_grad()
    def _log_prob(self, batch: Trajectory, minibatch: int) -> torch.Tensor:
        rows = torch.arange(batch.num_steps * batch.num_envs)
        return torch.cat([recompute_rows(self.policy, batch, r, self.cfg.ratio)[2] for r in rows.split(minibatch)])

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "return_scaler": self.return_scaler.state_dict() if self.return_scaler else None,
            "iterations": self.iterations,
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.iterations = int(state.get("iterations", 0))
        if self.return_scaler is not None and state.get("return_scaler"):
            self.return_scaler.load_state_dict(state["return_scaler"])


@ALGOS.register("ppo", PPOConfig)
def make_ppo(cfg: PPOConfig, policy: Policy) -> PPO:
    return PPO(cfg, policy)
