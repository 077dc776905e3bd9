"""SmolVLA: parity with lerobot 0.4.4's SmolVLAPolicy on a checkpoint lerobot wrote (tiny
SmolVLM, random weights), the policy acting in the units its checkpoint's statistics give, the
flow-policy contract (log-likelihoods, SFT) and refusals. Its PPO iteration on real ManiSkill
cameras is in test_families_end_to_end.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.core.errors import ConfigError
from embodied.core.types import Observation
from embodied.policies.pretrained.smolvla import SmolVLAConfig, SmolVLAPolicy, SmolVLMPrompt, prompts
from embodied.policies.pretrained.smolvla_model import resize_with_pad
from tests.policies.pi0_parity import NORM_MAPS
from tests.policies.published import save_lerobot_processors
from tests.policies.sft import bc_losses
from tests.policies.smolvla_parity import INSTRUCTIONS, TINY_SPEC, env_spec, loaded, pipeline_actions, run_reference

SPEC = env_spec(TINY_SPEC)


@pytest.fixture(scope="module")
def lerobot_smolvla(tmp_path_factory) -> Path:
    return run_reference(tmp_path_factory.mktemp("smolvla_reference"))


@pytest.mark.slow
def test_sample_matches_lerobot_on_a_checkpoint_it_saved(lerobot_smolvla):
    """Same weights, inputs and noise -> the same chunk from lerobot's sample_actions (after
    its own image preparation) and from this project's model loading lerobot's files."""
    t = {name: torch.from_numpy(value) for name, value in np.load(lerobot_smolvla / "inputs.npz").items()}
    model = loaded(lerobot_smolvla).model
    images = [resize_with_pad(t["frame0"], 32), resize_with_pad(t["frame1"], 32)]
    present = [torch.ones(3, dtype=torch.bool)] * 2
    ours = model.sample(images, present, t["tokens"], t["token_mask"], t["state"], t["noise"], 4)
    reference = np.load(lerobot_smolvla / "reference.npz")["actions"]
    assert np.abs(reference).max() > 0.5  # the chunk is not trivially small
    np.testing.assert_allclose(ours.numpy(), reference, atol=1e-5, rtol=1e-5)


def test_raw_observations_to_env_actions_match_lerobots_pipeline_in_every_mode(lerobot_smolvla, tmp_path):
    """Raw state and frames -> our policy -> env actions, against lerobot's preprocessor ->
    its image preparation and sample_actions -> postprocessor, in each normalisation mode."""
    for mode in NORM_MAPS:
        ours, reference = pipeline_actions(lerobot_smolvla, mode, tmp_path / mode)
        assert np.abs(reference).max() > 1.0, mode  # in the statistics' units, not the model's
        np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=1e-5, err_msg=mode)


def test_the_policy_acts_in_the_units_of_its_checkpoints_statistics(lerobot_smolvla, tmp_path):
    """Raw state and frames -> the policy's env actions equal the model's chunk from the same
    noise, with the state normalised and the actions unnormalised by the checkpoint's
    statistics (lerobot's MEAN_STD, recomputed here in float64)."""
    folder = tmp_path / "smolvla"
    shutil.copytree(lerobot_smolvla / "checkpoint", folder)
    rng = np.random.default_rng(1)
    stats = {
        "observation.state": {"mean": rng.normal(0, 2, 5), "std": rng.uniform(0.5, 1.5, 5)},
        "action": {"mean": rng.normal(0, 2, 3), "std": rng.uniform(0.5, 1.5, 3)},
    }
    features = json.loads((folder / "config.json").read_text())
    features = {**features["input_features"], **features["output_features"]}
    save_lerobot_processors(
        folder,
        features,
        {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        {f"{key}.{name}": value.astype(np.float32) for key, values in stats.items() for name, value in values.items()},
    )
    policy = loaded(lerobot_smolvla, pretrained=str(folder), normalization="checkpoint", sampler="ode", chunk_size=5)
    inputs = np.load(lerobot_smolvla / "inputs.npz")
    raw_state = rng.normal(1.0, 3.0, (3, 5))
    observation = Observation(
        state=torch.tensor(raw_state, dtype=torch.float32),
        images={"base": torch.from_numpy(inputs["frame0"]), "wrist": torch.from_numpy(inputs["frame1"])},
        instruction=INSTRUCTIONS,
    )
    with torch.no_grad():
        chunk = policy.act(observation, deterministic=True, generator=torch.Generator().manual_seed(4))
        noise = torch.randn(3, policy.dim, generator=torch.Generator().manual_seed(4)).view(3, 5, 32)
        state = (raw_state - stats["observation.state"]["mean"]) / (stats["observation.state"]["std"] + 1e-8)
        tokens, token_mask = SmolVLMPrompt(str(lerobot_smolvla / "smolvlm"))(prompts(INSTRUCTIONS), 12)
        images = [resize_with_pad(observation.images[name], 32) for name in ("base", "wrist")]
        present = [torch.ones(3, dtype=torch.bool)] * 2
        padded = torch.nn.functional.pad(torch.tensor(state, dtype=torch.float32), (0, 27))
        sampled = policy.model.sample(images, present, tokens, token_mask, padded, noise, 4)[..., :3].double()
    expected = sampled.numpy() * stats["action"]["std"] + stats["action"]["mean"]
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(chunk.actions.numpy(), expected, atol=1e-4, rtol=1e-5)
    assert policy.cameras == ["base", "wrist"]  # the checkpoint's inputs, by name


def observation(batch: int = 3, seed: int = 0) -> Observation:
    generator = torch.Generator().manual_seed(seed)
    return Observation(
        state=torch.randn(batch, 5, generator=generator),
        images={
            name: torch.randint(0, 256, (batch, *shape), dtype=torch.uint8, generator=generator)
            for name, shape in SPEC.image_shapes.items()
        },
        instruction=(INSTRUCTIONS * batch)[:batch],
    )


@pytest.mark.parametrize("sampler", ["flow_sde", "flow_noise"])
def test_the_chunk_log_prob_is_recomputed_from_the_recorded_chain(sampler):
    torch.manual_seed(0)
    policy = SmolVLAPolicy(SmolVLAConfig(sampler=sampler, horizon=3, denoise_steps=3, critic_hidden=[16]), SPEC)
    seen = observation()
    chunk = policy.act(seen)
    recomputed = policy.recompute(seen, chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob, atol=1e-4, rtol=1e-5)
    assert recomputed.value.shape == (3,) and torch.isfinite(recomputed.entropy).all()


@pytest.mark.slow
def test_flow_matching_sft_fits_demos_and_train_expert_only_keeps_the_vlm():
    for expert_only in (False, True):
        torch.manual_seed(0)
        policy = SmolVLAPolicy(SmolVLAConfig(horizon=3, denoise_steps=3, train_expert_only=expert_only), SPEC)
        seen, actions = observation(batch=6), torch.rand(6, 3, 3) * 3 - 1
        before = [p.detach().clone() for p in policy.model.text_layers.parameters()]
        losses = bc_losses(policy, seen, actions, steps=100, lr=3e-3)
        assert np.mean(losses[-10:]) < 0.75 * np.mean(losses[:10])
        moved = any(not torch.equal(a, b) for a, b in zip(before, policy.model.text_layers.parameters()))
        assert moved == (not expert_only)


def test_checkpoint_mismatches_are_refused_by_name(lerobot_smolvla, tmp_path):
    with pytest.raises(ConfigError, match="was trained with chunk_size=5; policy.horizon is 4"):
        loaded(lerobot_smolvla, horizon=4)
    with pytest.raises(ConfigError, match="no .*config.json"):
        loaded(lerobot_smolvla, vlm=str(tmp_path))
    assert loaded(lerobot_smolvla, vlm="auto").cfg.vlm == str(lerobot_smolvla / "smolvlm")  # the folder it names
    for key, value, vlm, message in (
        ("type", "pi0", "given", "holds a 'pi0' policy"),
        ("add_image_special_tokens", True, "given", "add_image_special_tokens"),
        ("num_expert_layers", 2, "given", "num_expert_layers=2"),
        ("vlm_model_name", "HuggingFaceTB/SmolVLM2-500M-Video-Instruct", "auto", "give policy.vlm"),
    ):
        folder = tmp_path / key
        shutil.copytree(lerobot_smolvla / "checkpoint", folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(ConfigError, match=message):
            loaded(lerobot_smolvla, pretrained=str(folder), **({"vlm": "auto"} if vlm == "auto" else {}))
    wider = tmp_path / "wider_smolvlm"  # a VLM other than the one the checkpoint was trained on
    wider.mkdir()
    config = json.loads((lerobot_smolvla / "smolvlm" / "config.json").read_text())
    config["text_config"]["hidden_size"] = 96
    (wider / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"does not match policy=smolvla.*of another shape"):
        loaded(lerobot_smolvla, vlm=str(wider))
