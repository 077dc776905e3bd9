"""Data-parallel PPO and GRPO over torch.distributed (gloo, 2 CPU processes) against one process."""

import json
import multiprocessing
import socket

import numpy as np
import pytest
import torch

from embodied.algos.distributed import DataParallel
from embodied.algos.ppo import PPO, PPOConfig
from embodied.core.types import EnvSpec
from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
from tests.cli import GRPO_ANY_OUTCOME, embodied
from tests.embodied.test_ppo import _batch
from tests.policies.tiny import tiny_pi0

SPEC = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
CONFIG = dict(num_minibatches=2, update_epochs=2, max_grad_norm=100.0)


def policy_batch_and_ppo():
    torch.manual_seed(0)
    policy = MLPGaussianPolicy(MLPPolicyConfig(chunk_size=2), SPEC)
    return policy, _batch(policy), PPO(PPOConfig(**CONFIG), policy)


def policy_batch_and_grpo():
    """Three groups of two envs, every group informative; 18 kept rows in minibatches of 3,
    so the two ranks' parts differ in size (1 and 2)."""
    import numpy as np

    from embodied.algos.buffers import TrajectoryBuilder
    from embodied.algos.grpo import GRPO, GRPOConfig
    from embodied.core.types import Observation, StepResult

    torch.manual_seed(0)
    policy = MLPGaussianPolicy(MLPPolicyConfig(), SPEC)
    envs, builder = 6, TrajectoryBuilder()
    for t in range(3):
        observation = Observation(state=torch.randn(envs, 3).numpy(), instruction=["push"] * envs)
        with torch.no_grad():
            chunk = policy.act(observation.to_torch())
        result = StepResult(
            observation=observation,
            reward=np.ones(envs, np.float32),
            terminated=np.zeros(envs, bool),
            truncated=np.full(envs, t == 2),
            success=np.array([1, 0, 1, 0, 0, 1], bool),
            executed_steps=np.ones(envs, np.int64),
            executed_action=chunk.actions.numpy(),
            final_observation=observation,
        )
        builder.add(observation, chunk, result, torch.zeros(envs))
    grpo = GRPO(GRPOConfig(group_size=2, num_minibatches=6, update_epochs=2, max_grad_norm=100.0), policy)
    return policy, builder.build(torch.zeros(envs)), grpo


def pi0_batch_and_ppo():
    """The tiny pi0 (state only): its vision tower, VLM and action expert are FSDP units."""
    torch.manual_seed(0)
    policy = tiny_pi0(SPEC, max_state_dim=4, max_action_dim=2, horizon=2, denoise_steps=2, sampler="flow_noise")
    return policy, _batch(policy), PPO(PPOConfig(**CONFIG), policy)


MAKERS = {"ppo": policy_batch_and_ppo, "grpo": policy_batch_and_grpo, "pi0_ppo": pi0_batch_and_ppo}


def learner_rank(rank: int, world: int, address: str, results, algo: str) -> None:
    torch.set_num_threads(1)
    policy, batch, learner = MAKERS[algo]()
    learner.data_parallel = DataParallel.join(rank, world, address, device="cpu")
    try:
        learner.update(batch, progress=0.0)
        # as numpy: torch would share tensor memory with a process that is about to exit
        results.put(
            (
                rank,
                [None if p.grad is None else p.grad.numpy().copy() for p in policy.parameters()],
                {k: v.numpy().copy() for k, v in policy.state_dict().items()},
            )
        )
    finally:
        learner.data_parallel.leave()


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
@pytest.mark.slow
def test_two_gloo_ranks_take_the_step_one_process_takes_on_the_whole_minibatch(algo):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=learner_rank, args=(rank, 2, address, results, algo)) for rank in range(2)]
    for process in ranks:
        process.start()
    outcome = {}
    for _ in ranks:
        rank, grads, weights = results.get(timeout=120)
        outcome[rank] = (
            [None if g is None else torch.from_numpy(g) for g in grads],
            {k: torch.from_numpy(v) for k, v in weights.items()},
        )
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0

    policy, batch, learner = MAKERS[algo]()
    metrics = learner.update(batch, progress=0.0)
    assert "loss/policy_loss" in metrics
    single_grads = [p.grad for p in policy.parameters()]
    (grads0, weights0), (grads1, weights1) = outcome[0], outcome[1]
    assert sum(g is not None for g in single_grads) >= 2
    for averaged, other, single in zip(grads0, grads1, single_grads):
        if single is None:  # a part the loss does not reach (GRPO has no critic term) stays without one
            assert averaged is None and other is None
            continue
        assert torch.equal(averaged, other)  # every rank applies the same average
        torch.testing.assert_close(averaged, single, rtol=1e-5, atol=1e-7)  # = the whole minibatch's gradient
    for name, value in policy.state_dict().items():
        assert torch.equal(weights0[name], weights1[name]), name
        torch.testing.assert_close(weights0[name], value, rtol=1e-5, atol=1e-6)


def test_a_minibatch_that_does_not_split_evenly_is_refused():
    from embodied.core.errors import ConfigError

    with pytest.raises(ConfigError, match="does not split evenly over 3 learner ranks"):
        DataParallel(0, 3).shard(8)


@pytest.mark.parametrize("algo, sharding", [("ppo", "replicate"), ("grpo", "replicate"), ("grpo", "fsdp")])
@pytest.mark.slow
def test_procs_with_two_learner_ranks_trains_like_one(tmp_path, algo, sharding):
    """Two ranks average the same gradients one process computes: only float summation order
    differs, so the weights after a short run agree closely; replicated or sharded."""

    from safetensors.torch import load_file

    from embodied.runs.checkpoint import resolve_checkpoint
    from tests.embodied.test_procs import updates_of

    tiny = [
        "runtime=procs",
        "env.num_envs=4",
        "env.num_workers=0",
        "algo.num_minibatches=2",
        "algo.update_epochs=2",
        "eval_episodes=0",
        "checkpoint_every=1",
        "runtime.device=cpu",
        "runtime.rollout_device=cpu",
        "logger.progress_bar=false",
    ]
    tiny += (
        ["algo.rollout_steps=10", "total_env_steps=80"]
        if algo == "ppo"
        # two updates each
        else [
            *GRPO_ANY_OUTCOME,
            "total_env_steps=400",
        ]
    )
    weights = {}
    for ranks in (1, 2):
        run_dir = tmp_path / f"ranks{ranks}"
        sharded = [f"runtime.learner_sharding={sharding}"] if ranks > 1 else []
        result = embodied("train", *tiny, *sharded, f"runtime.learner_ranks={ranks}", f"run_dir={run_dir}", check=False)
        assert result.returncode == 0, result.stderr
        assert [u["train/iteration"] for u in updates_of(run_dir)] == [1, 2]
        weights[ranks] = load_file(str(resolve_checkpoint(run_dir) / "weights.safetensors"))
    assert (tmp_path / "ranks2" / "logs" / "learner-rank-1.log").is_file()
    for name, value in weights[1].items():
        torch.testing.assert_close(weights[2][name], value, rtol=1e-4, atol=1e-5)


def test_gradient_accumulation_takes_the_same_step_in_parts():
    grads = {}
    for steps in (1, 4):
        torch.manual_seed(0)
        policy = MLPGaussianPolicy(MLPPolicyConfig(chunk_size=2), SPEC)
        batch = _batch(policy)
        PPO(PPOConfig(**{**CONFIG, "gradient_accumulation_steps": steps}), policy).update(batch, progress=0.0)
        grads[steps] = [p.grad for p in policy.parameters()]
    for whole, parts in zip(grads[1], grads[4]):
        torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-7)


def test_a_learners_whole_state_travels_to_another_rank():
    """What rank 0 sends the others on start and resume: weights, optimizer moments, counters,
    normalisation statistics; here for a model with more arrays than outside peers may send."""
    from embodied.core import codec
    from embodied.runtime.learner import Learner
    from embodied.runtime.learner_ranks import RANK_LIMITS, load_state_from_wire, state_to_wire

    def learner():
        torch.manual_seed(0)
        policy = MLPGaussianPolicy(MLPPolicyConfig(chunk_size=2, actor_hidden=[8] * 200), SPEC)
        return Learner(policy, PPO(PPOConfig(**CONFIG), policy), torch.device("cpu"))

    source, target = learner(), learner()
    source.update(_batch(source.policy), progress=0.0)
    message = codec.decode(codec.encode(state_to_wire(source)), RANK_LIMITS)
    load_state_from_wire(target, message)
    assert target.policy_version == source.policy_version == 1
    for name, value in source.policy.state_dict().items():
        assert torch.equal(target.policy.state_dict()[name], value), name
    moments = source.algo.optimizer.state_dict()["state"]
    assert len(moments) > 400
    for index, state in moments.items():
        assert torch.equal(target.algo.optimizer.state_dict()["state"][index]["exp_avg_sq"], state["exp_avg_sq"])


def test_learner_ranks_are_checked_before_any_process_starts():

    from embodied.config import TrainConfig, to_schema
    from embodied.core.compose import compose
    from embodied.core.errors import ConfigError
    from embodied.runtime.learner_ranks import check_learner_ranks

    config = to_schema(TrainConfig, compose("train", ["runtime=procs", "algo=sac_rlpd", "policy=squashed_gaussian"]))
    with pytest.raises(ConfigError, match="algo=ppo or algo=grpo"):
        check_learner_ranks(config, 2)
    check_learner_ranks(to_schema(TrainConfig, compose("train", ["runtime=procs", "algo=grpo"])), 2)
    config = to_schema(
        TrainConfig,
        compose("train", ["runtime=procs", "env.num_envs=3", "algo.rollout_steps=10", "algo.num_minibatches=2"]),
    )
    with pytest.raises(ConfigError, match="do not split over runtime.learner_ranks=2"):
        check_learner_ranks(config, 2)  # minibatches of 15
    config = to_schema(TrainConfig, compose("train", ["runtime=procs"]))
    with pytest.raises(ConfigError, match="set runtime.learner_ranks >= 2"):
        check_learner_ranks(config, 1, "fsdp")
    with pytest.raises(ConfigError, match="runtime.learner_sharding must be one of"):
        check_learner_ranks(config, 2, "zero3")


def fsdp_rank(rank: int, world: int, address: str, results) -> None:
    from embodied.algos.distributed import (
        full_optimizer_state,
        full_weights,
        optimizer_parameter_names,
        shard_with_optimizer,
    )

    torch.set_num_threads(1)
    policy, batch, ppo = pi0_batch_and_ppo()
    ppo.update(batch, progress=0.0)  # unsharded, the same on both ranks: Adam has moments to shard
    whole = sum(p.numel() for p in policy.parameters())
    ppo.data_parallel = parallel = DataParallel.join(rank, world, address, device="cpu")
    try:
        names = optimizer_parameter_names(policy, ppo.optimizer)
        ppo.optimizer = shard_with_optimizer(policy, ppo.optimizer, parallel)
        held = sum(p.to_local().numel() for p in policy.parameters())
        ppo.update(batch, progress=0.5)
        stepped = [p for p in policy.parameters() if p in ppo.optimizer.state]  # those with a gradient
        moments = sum(ppo.optimizer.state[p]["exp_avg"].to_local().numel() for p in stepped)
        moments /= sum(p.numel() for p in stepped) / whole
        grads = [None if p.grad is None else p.grad.full_tensor().numpy().copy() for p in policy.parameters()]
        weights = [p.full_tensor().detach().numpy().copy() for p in policy.parameters()]
        optimizer = full_optimizer_state(policy, ppo.optimizer, names)  # rank 0's, as an unsharded one's
        squares = {i: state["exp_avg_sq"].numpy().copy() for i, state in optimizer.get("state", {}).items()}
        gathered = {name: value.numpy().copy() for name, value in full_weights(policy).items()}  # rank 0's
        results.put((rank, grads, weights, held / whole, moments / whole, squares, gathered))
    finally:
        parallel.leave()


@pytest.mark.slow
def test_fsdp_ranks_hold_half_each_and_take_the_step_one_process_takes():
    """Two gloo ranks shard the tiny pi0 (FSDP2, its units and the rest) with the Adam moments
    of an earlier update: each holds about half of the parameters and of the moments, the
    next update's gathered gradients and weights are the single process's on the whole
    minibatch, and the optimizer state gathers on rank 0 in the unsharded layout."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=fsdp_rank, args=(rank, 2, address, results)) for rank in range(2)]
    for process in ranks:
        process.start()
    outcome = {}
    for _ in ranks:
        rank, *values = results.get(timeout=300)
        outcome[rank] = values
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0

    policy, batch, ppo = pi0_batch_and_ppo()
    ppo.update(batch, progress=0.0)
    ppo.update(batch, progress=0.5)
    for rank, (grads, weights, held, moments, _squares, _gathered) in outcome.items():
        assert 0.45 < held < 0.55 and 0.45 < moments < 0.55, (rank, held, moments)
        for (name, parameter), grad, weight in zip(policy.named_parameters(), grads, weights):
            assert (grad is None) == (parameter.grad is None), name
            scale = float(parameter.grad.abs().max()) if parameter.grad is not None else 0.0
            if grad is not None:  # float sums in another order: close relative to the gradient's size
                torch.testing.assert_close(torch.from_numpy(grad), parameter.grad, rtol=1e-4, atol=1e-5 * scale)
            torch.testing.assert_close(torch.from_numpy(weight), parameter.detach(), rtol=1e-4, atol=1e-6)
    # the whole state dict gathered for checkpoints and publishing: every key, on rank 0 alone,
    # each parameter exactly the DTensor's own gather of it (odd row counts included)
    gathered = outcome[0][5]
    assert outcome[1][5] == {} and sorted(gathered) == sorted(policy.state_dict())
    for (name, _), weight in zip(policy.named_parameters(), outcome[0][1]):
        assert gathered[name].shape == weight.shape and np.array_equal(gathered[name], weight), name
    single = ppo.optimizer.state_dict()["state"]
    assert outcome[1][4] == {} and sorted(outcome[0][4]) == sorted(single)
    for index, square in outcome[0][4].items():
        torch.testing.assert_close(torch.from_numpy(square), single[index]["exp_avg_sq"], rtol=1e-3, atol=1e-9)


@pytest.mark.slow
def test_procs_with_fsdp_ranks_trains_like_one_and_resumes_either_way(tmp_path):
    """The tiny pi0 on ManiSkill under runtime=procs: two FSDP ranks reach the weights one
    learner reaches in two updates (checkpoints and periodic evaluation in between, which
    gather the sharded policy); the run resumes from its checkpoint, the saved optimizer state
    sharded again, and then once more with a single learner."""

    from safetensors.torch import load_file

    from embodied.runs.checkpoint import resolve_checkpoint
    from tests.embodied.test_procs import updates_of
    from tests.policies.tiny import TINY_PI0

    tiny = [
        "runtime=procs",
        *TINY_PI0,
        "env.num_envs=4",
        "env.num_workers=0",
        "algo.rollout_steps=10",
        "algo.num_minibatches=2",
        "algo.update_epochs=1",
        "eval_episodes=0",
        "eval_every=1",
        "periodic_eval_episodes=2",
        "checkpoint_every=1",
        "runtime.device=cpu",
        "runtime.rollout_device=cpu",
        "logger.progress_bar=false",
    ]
    weights = {}
    for name, ranks in (
        ("one", ["runtime.learner_ranks=1"]),
        ("fsdp", ["runtime.learner_ranks=2", "runtime.learner_sharding=fsdp"]),
    ):
        run_dir = tmp_path / name
        result = embodied("train", *tiny, *ranks, "total_env_steps=80", f"run_dir={run_dir}", check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        updates = updates_of(run_dir)
        assert [u["train/iteration"] for u in updates] == [1, 2]
        weights[name] = load_file(str(resolve_checkpoint(run_dir) / "weights.safetensors"))
    assert weights["fsdp"].keys() == weights["one"].keys()
    for name, value in weights["one"].items():
        # Adam turns float-order noise in near-zero gradients into up to a fraction of a step (lr 3e-4)
        torch.testing.assert_close(weights["fsdp"][name], value, rtol=1e-3, atol=1e-4)
    evaluations = [
        json.loads(line)
        for line in (tmp_path / "fsdp" / "metrics.jsonl").read_text().splitlines()
        if "eval/success_rate" in line
    ]
    assert len(evaluations) == 2

    for steps, ranks in ((120, []), (160, ["runtime.learner_ranks=1", "runtime.learner_sharding=replicate"])):
        result = embodied("train", f"resume={tmp_path / 'fsdp'}", f"total_env_steps={steps}", *ranks, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
    assert [u["train/iteration"] for u in updates_of(tmp_path / "fsdp")] == [1, 2, 3, 4]
    from embodied.core.errors import ConfigError
    from embodied.train import resume_config

    with pytest.raises(ConfigError, match="cannot change 'runtime.max_policy_lag'"):  # the rest of the runtime stays
        resume_config(str(tmp_path / "fsdp"), ["runtime.max_policy_lag=1"])


def test_rank_zero_serves_the_rendezvous_on_its_address_only():
    """torch's store alone would listen on every interface; a loopback run stays on loopback."""
    import psutil

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    parallel = DataParallel.join(0, 1, f"127.0.0.1:{port}")
    try:
        listening = [c.laddr for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
        assert ("127.0.0.1", port) in [(a.ip, a.port) for a in listening]
        assert all(a.ip == "127.0.0.1" for a in listening), listening
    finally:
        parallel.leave()
