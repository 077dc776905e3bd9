"""The pi0-style flow VLA on a tiny random PaliGemma: prefix, action expert, value heads."""

import numpy as np
import pytest
import torch

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.vla.vlm_expert import VLMExpertConfig, VLMExpertPolicy
from tests.policies.sft import bc_losses

SPEC = EnvSpec(
    state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0), image_shapes={"base": (48, 64, 3)}
)


def camera_observation(batch=3, seed=0, invert=False):
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (batch, 48, 64, 3), generator=g, dtype=torch.uint8)
    return Observation(
        state=torch.randn(batch, 3, generator=g),
        images={"base": 255 - image if invert else image},
        instruction=["pick the cube"] * batch,
    )


def policy(**overrides) -> VLMExpertPolicy:
    torch.manual_seed(0)
    return VLMExpertPolicy(VLMExpertConfig(critic_hidden=[16], **overrides), SPEC)


@pytest.mark.parametrize("sampler", ["flow_sde", "flow_noise"])
def test_the_chunk_log_prob_is_recomputed_from_the_recorded_chain(sampler):
    vla, seen = policy(sampler=sampler), camera_observation()
    chunk = vla.act(seen, generator=torch.Generator().manual_seed(1))
    recomputed = vla.recompute(seen, chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob)
    if sampler == "flow_noise":  # one term per denoising step, for per-step ratios
        torch.testing.assert_close(recomputed.term_log_prob, chunk.record["term_log_prob"])
    assert chunk.actions.shape == (3, 1, 2) and (chunk.actions.abs() <= 1).all()


def test_the_action_expert_sees_the_images_through_the_vlm():
    vla = policy()
    with torch.no_grad():
        a = vla.act(camera_observation(), deterministic=True, generator=torch.Generator().manual_seed(0)).actions
        b = vla.act(
            camera_observation(invert=True), deterministic=True, generator=torch.Generator().manual_seed(0)
        ).actions
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("value_from", ["prefix", "expert"])
@pytest.mark.parametrize("detach", [True, False])
def test_the_value_head_reads_the_prefix_or_the_expert_detached_or_not(value_from, detach):
    vla = policy(value_from=value_from, detach_value_input=detach)
    vla.value(camera_observation()).sum().backward()
    reached = {
        part: any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
        for part, module in (("critic", vla.critic), ("expert", vla.expert), ("backbone", vla.backbone))
    }
    assert reached["critic"]
    assert reached["backbone"] == (not detach)
    assert reached["expert"] == (value_from == "expert" and not detach)


@pytest.mark.slow
def test_flow_matching_sft_moves_the_vlm_and_the_expert_unless_the_backbone_is_frozen():
    for frozen in (False, True):
        vla = policy(freeze_backbone=frozen)
        seen, actions = camera_observation(batch=8), torch.rand(8, 4, 2) * 2 - 1
        before = [p.detach().clone() for p in vla.backbone.parameters()]
        losses = bc_losses(vla, seen, actions, steps=60, lr=3e-3)
        assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:10])
        moved = any(not torch.equal(a, b) for a, b in zip(before, vla.backbone.parameters()))
        assert moved == (not frozen)


def save_tiny_vlm(path, seed=0):
    """A small random PaliGemma and a word-level tokenizer, saved as a user's checkpoint is."""
    from embodied.policies.vla.vlm import tiny_paligemma
    from tests.policies.checkpoints import save_word_tokenizer

    save_word_tokenizer(path, ["[PAD]", "[UNK]", "pick", "the", "cube"])
    torch.manual_seed(seed)
    tiny_paligemma(300, 32, 1, 2, 32, 8, image_token_index=257).save_pretrained(path)


def test_a_frozen_pretrained_backbone_stays_out_of_checkpoints_and_is_checked_on_load(tmp_path):
    from embodied.core.errors import CheckpointError
    from embodied.runs.checkpoint import load_checkpoint, load_policy_weights
    from tests.policies.checkpoints import save_and_restore, saves_whole

    base = tmp_path / "vlm"
    save_tiny_vlm(base)
    make = lambda **overrides: VLMExpertPolicy(  # noqa: E731
        VLMExpertConfig(backbone=str(base), critic_hidden=[16], **{"freeze_backbone": True, **overrides}), SPEC
    )
    weights, record, whole, checkpoint = save_and_restore(make, tmp_path / "checkpoints")
    assert record["source"] == str(base)
    assert not any(name.startswith("backbone.") for name in weights)
    assert "state_embedding.weight" in weights and any(name.startswith("expert.") for name in weights)
    assert record["count"] == sum(name.startswith("backbone.") for name in whole)

    assert saves_whole(make(freeze_backbone=False)) and saves_whole(policy(freeze_backbone=True))  # or tiny
    save_tiny_vlm(base, seed=5)  # the VLM at that path changed since training
    with pytest.raises(CheckpointError, match="not those this checkpoint was trained on"):
        load_policy_weights(make(), *load_checkpoint(checkpoint))


def test_state_observations_and_unknown_value_heads_are_refused():
    with pytest.raises(ConfigError, match="env.obs_mode=rgb"):
        VLMExpertPolicy(
            VLMExpertConfig(), EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0,) * 2, action_high=(1.0,) * 2)
        )
    with pytest.raises(ConfigError, match="policy.value_from"):
        VLMExpertPolicy(VLMExpertConfig(value_from="critic"), SPEC)
