"""Collocated placement: a role's policy and optimizer state go to CPU memory while it is idle
and come back unchanged."""

import copy

import pytest
import torch

from embodied.algos.ppo import PPO, PPOConfig
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
from embodied.runtime.configs import ProcsRuntimeConfig
from embodied.runtime.learner import Learner
from embodied.runtime.offload import Offloader
from embodied.runtime.procs import check_config

SPEC = EnvSpec(state_dim=5, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))


def stepped_learner(seed: int = 0) -> Learner:
    """A learner whose optimizer has moments, after one Adam step on a made-up loss."""
    torch.manual_seed(seed)
    policy = MLPGaussianPolicy(MLPPolicyConfig(), SPEC)
    learner = Learner(policy, PPO(PPOConfig(), policy), torch.device("cpu"))
    step(learner)
    return learner


def step(learner: Learner) -> None:
    optimizer = learner.algo.optimizer
    optimizer.zero_grad()
    loss = sum((p**2).sum() for p in learner.policy.parameters())
    loss.backward()
    optimizer.step()


def test_offload_empties_the_device_copies_and_reload_restores_them_exactly():
    learner = stepped_learner()
    twin = copy.deepcopy(learner)
    parameters = list(learner.policy.parameters())
    learner.collocate()
    learner.offloader.offload()
    assert all(p.numel() == 0 and p.grad is None for p in parameters)
    moments = [v for state in learner.algo.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    assert moments and all(v.numel() == 0 for v in moments)
    assert learner.offloader.bytes_moved > sum(p.numel() * 4 for p in twin.policy.parameters())  # weights + moments
    with pytest.raises(RuntimeError, match="offloaded"):
        learner.get_weights()  # a checkpoint now would hold empty tensors: refused
    with pytest.raises(RuntimeError):  # computing while offloaded fails loudly
        learner.policy.value(Observation(state=torch.zeros(1, 5), images={}, instruction=[""]))

    learner.offloader.reload()
    assert list(learner.policy.parameters()) == parameters  # the same objects, so the optimizer's keys hold
    for name, value in twin.policy.state_dict().items():
        assert torch.equal(learner.policy.state_dict()[name], value), name
    step(learner)
    step(twin)
    for mine, theirs in zip(learner.policy.parameters(), twin.policy.parameters()):
        assert torch.equal(mine, theirs)  # the moments came back too: the next step is the same step


def test_offloading_twice_or_reloading_a_loaded_module_changes_nothing():
    module = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    offloader = Offloader(module)
    offloader.reload()
    offloader.offload()
    offloader.offload()
    offloader.reload()
    assert not offloader.offloaded
    for name, value in module.state_dict().items():
        assert torch.equal(value, before[name])


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"placement": "shared"}, "runtime.placement must be one of"),
        ({"placement": "collocated", "max_policy_lag": 1}, "set runtime.max_policy_lag=0"),
        (
            {"placement": "collocated", "learner_ranks": 2, "learner_sharding": "fsdp"},
            "runtime.placement=disaggregated",
        ),
    ],
)
def test_placements_that_cannot_work_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        check_config(ProcsRuntimeConfig(**changes))
