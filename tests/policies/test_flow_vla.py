"""The built-in VLA: real pretrained encoders (offline packages) and the flow expert on real
ManiSkill camera observations."""

import os

import cv2
import matplotlib
import pytest
import torch

from embodied.build import build_env, build_policy
from embodied.config import TrainConfig, to_schema
from embodied.core.compose import compose
from embodied.policies.encoders import EfficientNetLite0, SentenceEncoder

MILITARY_UNIFORM = 652  # ImageNet class of the photograph of Grace Hopper that matplotlib ships


def test_the_image_encoder_recognises_a_photograph():
    path = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data", "grace_hopper.jpg")
    image = cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB)[44:556]  # the centre square
    image = cv2.resize(image, (224, 224), interpolation=cv2.INTER_AREA)
    logits = EfficientNetLite0.pretrained().classify(torch.from_numpy(image)[None])
    assert int(logits.argmax()) == MILITARY_UNIFORM


def test_the_sentence_encoder_puts_paraphrases_closer_than_other_tasks():
    pick, lift, drawer = SentenceEncoder()(["pick up the red cube", "lift the red block", "open the top drawer"])
    assert float(pick @ lift) > float(pick @ drawer) + 0.15
    assert torch.allclose(pick.norm(), torch.tensor(1.0), atol=1e-5)


@pytest.fixture(scope="module")
def vla_and_observation():
    config = to_schema(
        TrainConfig,
        compose(
            "train", ["policy=flow_vla", "env.obs_mode=rgb", "env.num_envs=2", "env.num_workers=0", "env.image_size=64"]
        ),
    )
    env = build_env(config.env, seed=0)
    try:
        observation = env.reset()
    finally:
        env.close()
    torch.manual_seed(0)
    return build_policy(config.policy, env.spec, torch.device("cpu")), observation.to_torch()


@pytest.mark.slow
def test_the_log_prob_of_a_sample_is_recomputed_from_its_record_and_from_its_images(vla_and_observation):
    policy, observation = vla_and_observation
    chunk = policy.act(observation, generator=torch.Generator().manual_seed(1))
    assert chunk.actions.shape == (2, 1, policy.spec.action_dim)
    from_record = policy.recompute(observation, chunk)
    features = chunk.record.pop("features")
    from_images = policy.recompute(observation, chunk)
    chunk.record["features"] = features
    torch.testing.assert_close(from_record.log_prob, chunk.log_prob)
    torch.testing.assert_close(from_images.log_prob, chunk.log_prob)


def test_the_encoders_stay_frozen_and_in_eval_mode(vla_and_observation):
    policy, observation = vla_and_observation
    policy.train()
    assert not policy.image_encoder.training
    assert not any(p.requires_grad for p in policy.image_encoder.parameters())
    chunk = policy.act(observation)
    loss = policy.recompute(observation, chunk).log_prob.sum() + policy.value(observation).sum()
    loss.backward()
    assert all(p.grad is None for p in policy.image_encoder.parameters())
    assert policy.text_projection[0].weight.grad is not None  # the projections do learn
    assert not any(name.startswith("text_encoder") for name in policy.state_dict())  # comes from its package
    policy.zero_grad()
    policy.eval()


def test_sft_with_features_computed_once_equals_sft_that_encodes_every_step(vla_and_observation):
    policy, observation = vla_and_observation
    actions = torch.zeros(observation.batch_size, 1, policy.spec.action_dim)
    torch.manual_seed(3)
    encoded = policy.bc_loss(observation, actions)
    torch.manual_seed(3)
    cached = policy.bc_loss(observation, actions, features=policy.frozen_features(observation))
    assert torch.equal(encoded, cached)
