"""Token VLA on a tiny random Qwen2 backbone (transformers), CPU."""

import numpy as np
import pytest
import torch

from embodied.core.types import EnvSpec, Observation
from embodied.policies.vla.token_vla import TokenVLAConfig, TokenVLAPolicy
from embodied.runtime.wire import published_weights
from tests.cli import GRPO_ANY_OUTCOME, NO_EVAL, QUIET, embodied

SPEC = EnvSpec(state_dim=5, action_dim=3, action_low=(-1.0, -2.0, 0.0), action_high=(1.0, 2.0, 1.0))


def observation(batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Observation(
        state=torch.randn(batch, 5, generator=g), instruction=["push the cube", "lift it", "", "push the cube"][:batch]
    )


def demonstrated_actions():
    """(4, 1, 3) actions for `observation()`'s four rows; the first and last rows agree."""
    return torch.tensor([[[0.5, -1.0, 0.2]], [[0.1, 1.5, 0.9]], [[-0.5, 0.0, 0.5]], [[0.5, -1.0, 0.2]]])


@pytest.mark.parametrize("decoder", ["causal", "parallel"])
def test_sampled_log_prob_equals_the_training_recomputation(decoder):
    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(decoder=decoder, chunk_size=2, temperature=0.7), SPEC)
    policy.train()
    chunk = policy.act(observation(), generator=torch.Generator().manual_seed(1))
    recomputed = policy.recompute(observation(), chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob)
    torch.testing.assert_close(recomputed.value, chunk.value)
    assert chunk.actions.shape == (4, 2, 3) and chunk.record["action_tokens"].shape == (4, 6)
    low, high = torch.tensor(SPEC.action_low), torch.tensor(SPEC.action_high)
    assert ((chunk.actions >= low) & (chunk.actions <= high)).all()
    assert (recomputed.entropy > 0).all() and (chunk.log_prob < 0).all()


def test_causal_log_prob_is_the_sum_of_term_log_probs_under_the_restricted_softmax():
    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(decoder="causal"), SPEC)
    obs = observation(batch=1)
    chunk = policy.act(obs, generator=torch.Generator().manual_seed(3))
    tokens = chunk.record["action_tokens"][0]
    # Score token by token with plain forward passes over the growing sequence.
    prefix, mask = policy._prefix(obs)
    total, embeddings = 0.0, prefix
    with torch.no_grad():
        for token in tokens:
            grown = torch.cat([mask, torch.ones(1, embeddings.shape[1] - mask.shape[1], dtype=torch.long)], 1)
            logits = policy.backbone(inputs_embeds=embeddings, attention_mask=grown).logits[0, -1]
            action_log_probs = torch.log_softmax(logits[policy.actions.first_token :], -1)
            total += float(action_log_probs[token - policy.actions.first_token])
            embeddings = torch.cat([embeddings, policy._token_embeddings()(token.view(1, 1))], 1)
    assert float(chunk.log_prob[0]) == pytest.approx(total, abs=1e-4)


def test_deterministic_act_takes_the_most_likely_tokens():
    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(decoder="parallel"), SPEC)
    chunk = policy.act(observation(), deterministic=True)
    log_probs, _ = policy._score(observation(), None)
    np.testing.assert_array_equal(chunk.record["action_tokens"] - policy.actions.first_token, log_probs.argmax(-1))


def test_behaviour_cloning_loss_falls():
    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(decoder="causal"), SPEC)
    obs, actions = observation(), demonstrated_actions()
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    first = float(policy.bc_loss(obs, actions))
    loss = fit_by_behaviour_cloning(policy, optimizer, obs, actions, steps=30)
    assert float(loss) < 0.5 * first


def fit_by_behaviour_cloning(policy, optimizer, obs, actions, steps):
    """`steps` Adam steps on the BC loss; the last step's loss."""
    for _ in range(steps):
        loss = policy.bc_loss(obs, actions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss


def test_lora_publishes_only_adapters_heads_and_buffers():
    full = published_weights(TokenVLAPolicy(TokenVLAConfig(), SPEC))
    lora = published_weights(TokenVLAPolicy(TokenVLAConfig(lora_rank=4), SPEC))
    size = lambda weights: sum(t.numel() * t.element_size() for t in weights.values())  # noqa: E731
    assert any("lora_" in name for name in lora)
    assert not any(("q_proj.base_layer" in name or "mlp.gate_proj" in name) for name in lora)
    assert size(lora) < 0.25 * size(full)


def save_tiny_causal_lm(path, seed=0):
    """A one-layer random Llama and a word-level tokenizer, saved as a user's checkpoint is."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.policies.checkpoints import save_word_tokenizer

    save_word_tokenizer(path, ["[PAD]", "[UNK]", "push", "the", "cube", "lift", "it"])
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)


def test_a_causal_lm_and_its_tokenizer_load_from_a_local_path(tmp_path):
    save_tiny_causal_lm(tmp_path)

    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(backbone=str(tmp_path), decoder="causal"), SPEC)
    assert policy.actions.first_token == 300 - 256
    ids, mask = policy.instructions(["push the cube", "lift it now"], 4)
    assert ids.tolist() == [[0, 2, 3, 4], [0, 5, 6, 1]] and mask.tolist() == [[0, 1, 1, 1], [0, 1, 1, 1]]
    chunk = policy.act(observation(batch=2), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(policy.recompute(observation(batch=2), chunk).log_prob, chunk.log_prob)
    with pytest.raises(Exception, match="could not be loaded"):
        TokenVLAPolicy(TokenVLAConfig(backbone=str(tmp_path / "missing")), SPEC)


def test_a_lora_checkpoint_keeps_what_training_changes_and_checks_the_frozen_rest(tmp_path):
    from embodied.core.errors import CheckpointError
    from embodied.runs.checkpoint import load_checkpoint, load_policy_weights
    from tests.policies.checkpoints import save_and_restore, size

    base = tmp_path / "base"
    save_tiny_causal_lm(base)
    config = TokenVLAConfig(backbone=str(base), lora_rank=4)

    def make():
        policy = TokenVLAPolicy(config, SPEC)
        policy.update_normalization(observation())
        return policy

    weights, record, whole, checkpoint = save_and_restore(make, tmp_path / "checkpoints")
    frozen = {name for name, p in make().named_parameters() if not p.requires_grad}
    assert record["source"] == str(base) and record["count"] >= len(frozen) > 0
    assert not frozen & weights.keys() and any("lora_" in name for name in weights)
    assert {"normalizer.mean", "state_embedding.weight", "action_queries"} <= weights.keys()
    assert size(weights) < 0.2 * size(whole)

    saved_weights, state = load_checkpoint(checkpoint)
    with pytest.raises(RuntimeError, match="missing.*action_queries"):
        load_policy_weights(
            TokenVLAPolicy(config, SPEC), {k: v for k, v in saved_weights.items() if k != "action_queries"}, state
        )
    with pytest.raises(RuntimeError, match="does not load frozen"):  # a full fine-tune has nothing frozen
        load_policy_weights(TokenVLAPolicy(TokenVLAConfig(backbone=str(base)), SPEC), saved_weights, state)
    save_tiny_causal_lm(base, seed=5)  # the base at that path changed since training
    with pytest.raises(CheckpointError, match="not those this checkpoint was trained on"):
        load_policy_weights(TokenVLAPolicy(config, SPEC), saved_weights, state)


def test_tiny_backbones_and_full_fine_tunes_keep_every_weight_in_checkpoints(tmp_path):
    from tests.policies.checkpoints import saves_whole

    save_tiny_causal_lm(tmp_path)
    for config in (TokenVLAConfig(lora_rank=4), TokenVLAConfig(backbone=str(tmp_path))):
        assert saves_whole(TokenVLAPolicy(config, SPEC))


@pytest.mark.slow
def test_a_lora_run_on_a_local_backbone_trains_resumes_and_evaluates_from_adapter_checkpoints(tmp_path):
    from safetensors import safe_open

    base = tmp_path / "base"
    save_tiny_causal_lm(base)
    run_dir = tmp_path / "run"
    quiet = ["logger.progress_bar=false", "eval_episodes=0"]

    embodied(
        "train",
        *quiet,
        "env=mujoco_invertedpendulum",
        "env.num_envs=2",
        "policy=token_vla",
        f"policy.backbone={base}",
        "policy.lora_rank=4",
        *GRPO_ANY_OUTCOME,
        "algo.rollout_steps=4",
        "algo.num_minibatches=1",
        "total_env_steps=8",
        "checkpoint_every=1",
        f"run_dir={run_dir}",
    )
    embodied("train", *quiet, f"resume={run_dir}", "total_env_steps=16")
    checkpoint = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    assert checkpoint.name == "iter_000002"
    with safe_open(str(checkpoint / "weights.safetensors"), "pt") as saved:
        names = list(saved.keys())
    assert any("lora_" in name for name in names)
    assert not any("base_layer" in name or "mlp.up_proj" in name or "embed_tokens" in name for name in names)
    embodied("eval", f"checkpoint={run_dir}", "episodes=2", "progress_bar=false", f"output={tmp_path / 'eval'}")
    assert (tmp_path / "eval" / "report.json").is_file()


@pytest.mark.parametrize("decoder", ["causal", "parallel"])
def test_an_mlp_value_head_reads_the_hidden_state_before_the_actions_and_the_state(decoder):
    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(decoder=decoder, critic_hidden=[16], value_reads_state=True), SPEC)
    obs = observation()
    with torch.no_grad():
        chunk = policy.act(obs)
        prefix, mask = policy._prefix(obs)  # one plain pass over the whole prefix
        hidden = policy.backbone(inputs_embeds=prefix, attention_mask=mask, output_hidden_states=True).hidden_states[
            -1
        ][:, -1]
        expected = policy.value_head(torch.cat([hidden, policy.normalizer(obs.state)], -1)).squeeze(-1)
        torch.testing.assert_close(policy.value(obs), expected)
        torch.testing.assert_close(chunk.value, expected)
        torch.testing.assert_close(policy.recompute(obs, chunk).value, expected)
    assert [p.shape for p in policy.value_parameters()] == [(16, 64 + 5), (16,), (1, 16), (1,)]


def test_critic_warmup_leaves_the_shared_backbone_alone():
    from embodied.algos.buffers import TrajectoryBuilder
    from embodied.algos.ppo import PPO, PPOConfig
    from embodied.core.types import StepResult

    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(hidden_size=32, num_layers=1), SPEC)
    builder = TrajectoryBuilder()
    for t in range(4):
        obs = Observation(state=np.random.default_rng(t).normal(size=(2, 5)).astype(np.float32), instruction=["go"] * 2)
        with torch.no_grad():
            chunk = policy.act(obs.to_torch())
        result = StepResult(
            observation=obs,
            reward=np.ones(2, np.float32) * t,
            terminated=np.zeros(2, bool),
            truncated=np.zeros(2, bool),
            success=np.zeros(2, bool),
            executed_steps=np.ones(2, np.int64),
            executed_action=chunk.actions.numpy(),
            final_observation=obs,
        )
        builder.add(obs, chunk, result, torch.zeros(2))
    batch = builder.build(torch.zeros(2))
    backbone = [p.detach().clone() for p in policy.backbone.parameters()]
    head = [p.detach().clone() for p in policy.value_head.parameters()]
    PPO(PPOConfig(update_epochs=1, num_minibatches=2, critic_warmup_iterations=1), policy).update(batch, 0.0)
    for before, after in zip(backbone, policy.backbone.parameters()):
        torch.testing.assert_close(before, after)
    assert any(not torch.equal(b, a) for b, a in zip(head, policy.value_head.parameters()))


RGB = EnvSpec(
    state_dim=5,
    action_dim=3,
    action_low=(-1.0, -2.0, 0.0),
    action_high=(1.0, 2.0, 1.0),
    image_shapes={"base": (48, 64, 3), "wrist": (32, 32, 3)},
)


def camera_observation(batch=3, seed=0, invert=False):
    g = torch.Generator().manual_seed(seed)
    images = {
        name: torch.randint(0, 256, (batch, *shape), generator=g, dtype=torch.uint8)
        for name, shape in RGB.image_shapes.items()
    }
    if invert:
        images = {name: 255 - image for name, image in images.items()}
    return Observation(state=torch.randn(batch, 5, generator=g), images=images, instruction=["pick the cube"] * batch)


@pytest.mark.parametrize("decoder", ["causal", "parallel"])
def test_a_vision_language_backbone_reads_every_camera(decoder):
    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(backbone="tiny_vlm", decoder=decoder, chunk_size=2), RGB)
    seen = camera_observation()
    chunk = policy.act(seen, generator=torch.Generator().manual_seed(1))
    recomputed = policy.recompute(seen, chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob)  # rollout and training agree
    # other images, same everything else: another distribution over the same action
    assert not torch.allclose(policy.recompute(camera_observation(invert=True), chunk).log_prob, chunk.log_prob)
    loss = policy.bc_loss(seen, torch.zeros(3, 2, 3))
    loss.backward()
    patches = [p.grad for name, p in policy.backbone.named_parameters() if "patch_embedding" in name]
    assert patches and all(g is not None and g.abs().sum() > 0 for g in patches)  # the vision tower trains too


def test_a_smolvlm_and_its_tokenizer_load_from_a_local_path(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, SmolVLMConfig, SmolVLMForConditionalGeneration

    words = ["[PAD]", "[UNK]", "pick", "the", "cube"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(tmp_path)
    config = SmolVLMConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        text_config=dict(
            model_type="llama",
            vocab_size=400,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
        ),
        scale_factor=2,
        image_token_id=5,
    )
    SmolVLMForConditionalGeneration(config).save_pretrained(tmp_path)

    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(backbone=str(tmp_path)), RGB)
    assert policy.actions.first_token == 400 - 256
    assert policy.image_tokens(camera_observation().images["base"]).shape == (3, 4, 64)  # 16 patches, shuffled by 2
    seen = camera_observation()
    chunk = policy.act(seen, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(policy.recompute(seen, chunk).log_prob, chunk.log_prob)


def test_cameras_need_a_backbone_that_reads_images():
    from embodied.core.errors import ConfigError

    with pytest.raises(ConfigError, match="policy.backbone=tiny_vlm"):
        TokenVLAPolicy(TokenVLAConfig(backbone="tiny"), RGB)


@pytest.mark.slow
def test_one_grpo_iteration_on_maniskill_cameras_with_a_vision_language_backbone(tmp_path):
    import json

    from embodied.runs.checkpoint import load_checkpoint, resolve_checkpoint

    run_dir = tmp_path / "run"
    result = embodied(
        "train",
        "policy=token_vla",
        "policy.backbone=tiny_vlm",
        "env.obs_mode=rgb",
        "env.image_size=32",
        "env.num_envs=2",
        "env.num_workers=0",
        *GRPO_ANY_OUTCOME,
        "algo.num_minibatches=2",
        "total_env_steps=100",
        *NO_EVAL,
        *QUIET,
        f"run_dir={run_dir}",
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    update = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert update["grpo/informative_groups"] == 1 and np.isfinite(update["loss/policy_loss"])
    weights, state = load_checkpoint(resolve_checkpoint(run_dir))  # tied embeddings and all
    policy = TokenVLAPolicy(
        TokenVLAConfig(backbone="tiny_vlm"),
        EnvSpec(
            state_dim=weights["state_embedding.weight"].shape[1],
            action_dim=weights["action_queries"].shape[0],
            action_low=(-1.0,) * weights["action_queries"].shape[0],
            action_high=(1.0,) * weights["action_queries"].shape[0],
            image_shapes={"base_camera": (32, 32, 3)},
        ),
    )
    policy.load_state_dict(weights)
    assert state["learner"]["policy_version"] == 1


@pytest.mark.parametrize("decoder", ["causal", "parallel"])
def test_instructions_shared_by_rows_run_once_with_the_same_result_and_gradients(decoder):
    torch.manual_seed(0)
    policy = TokenVLAPolicy(TokenVLAConfig(decoder=decoder, chunk_size=2), SPEC)
    obs = Observation(state=torch.randn(5, 5), instruction=["push the cube", "lift it", "", "push the cube", "x" * 80])
    chunk = policy.act(obs, generator=torch.Generator().manual_seed(1))
    results = {}
    for shared in (True, False):
        policy.shares_instruction = shared
        policy.zero_grad()
        recomputed = policy.recompute(obs, chunk)
        (recomputed.log_prob.sum() + recomputed.value.sum()).backward()
        results[shared] = (
            recomputed,
            {name: p.grad.clone() for name, p in policy.named_parameters() if p.grad is not None},
        )
    (shared, shared_grads), (plain, plain_grads) = results[True], results[False]
    torch.testing.assert_close(shared.log_prob, plain.log_prob)
    torch.testing.assert_close(shared.value, plain.value)
    torch.testing.assert_close(shared.log_prob, chunk.log_prob)
    assert shared_grads.keys() == plain_grads.keys() and len(shared_grads) > 10
    for name, grad in shared_grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("decoder", ["causal", "parallel"])
def test_bfloat16_runs_the_backbone_in_bfloat16_and_keeps_weights_log_probs_and_values_in_float32(decoder):
    torch.manual_seed(0)
    exact = TokenVLAPolicy(TokenVLAConfig(decoder=decoder, chunk_size=2), SPEC)
    halved = TokenVLAPolicy(TokenVLAConfig(decoder=decoder, chunk_size=2, precision="bfloat16"), SPEC)
    halved.load_state_dict(exact.state_dict())
    seen = []
    hook = halved.backbone.model.layers[0].mlp.register_forward_hook(lambda *args: seen.append(args[2].dtype))
    obs = observation()
    chunk = halved.act(obs, generator=torch.Generator().manual_seed(1))
    recomputed = halved.recompute(obs, chunk)
    hook.remove()
    assert set(seen) == {torch.bfloat16}
    assert chunk.log_prob.dtype == recomputed.log_prob.dtype == recomputed.value.dtype == torch.float32
    # the same arithmetic at rollout and in training; bfloat16 rounding moves it off float32's
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob)
    torch.testing.assert_close(recomputed.value, chunk.value)  # the causal decoder's comes from its own pass
    torch.testing.assert_close(halved.value(obs), recomputed.value.detach())
    reference = exact.recompute(obs, chunk).log_prob.detach()
    assert 0 < (recomputed.log_prob.detach() - reference).abs().max() < 0.5
    recomputed.log_prob.sum().backward()
    assert all(p.dtype == torch.float32 for p in halved.parameters())
    grad = halved.state_embedding.weight.grad
    assert grad.dtype == torch.float32 and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_an_unknown_precision_is_refused_by_name():
    from embodied.core.errors import ConfigError

    with pytest.raises(ConfigError, match="policy.precision must be one of .* got 'float16'"):
        TokenVLAPolicy(TokenVLAConfig(precision="float16"), SPEC)


def test_smoothed_sft_targets_are_gaussians_over_neighbouring_bins_cut_at_the_ends():
    from embodied.policies.vla.token_vla import smoothed_targets

    targets = smoothed_targets(torch.tensor([[100, 0, 255]]), sigma=2.0)
    torch.testing.assert_close(targets.sum(-1), torch.ones(1, 3))
    assert targets.argmax(-1).tolist() == [[100, 0, 255]]
    middle = targets[0, 0]
    assert float(middle[102] / middle[100]) == pytest.approx(np.exp(-0.5), rel=1e-5)
    assert float(middle[98]) == pytest.approx(float(middle[102]))
    assert float(middle[110]) < 1e-5
    assert float(targets[0, 1, 0]) > float(middle[100])  # the cut-off half's mass goes to the rest


@pytest.mark.slow
def test_smoothed_sft_spreads_the_policy_over_neighbouring_bins_and_keeps_its_mode():
    obs, actions = observation(), demonstrated_actions()
    fitted = {}
    for sigma in (0.0, 4.0):
        torch.manual_seed(0)
        policy = TokenVLAPolicy(TokenVLAConfig(decoder="parallel", label_sigma_bins=sigma), SPEC)
        fit_by_behaviour_cloning(policy, torch.optim.Adam(policy.parameters(), lr=3e-3), obs, actions, steps=150)
        with torch.no_grad():
            log_probs, _ = policy._score(obs, None)
        fitted[sigma] = log_probs
    demonstrated = policy.actions.encode(actions.reshape(4, 3).numpy()) - policy.actions.first_token
    for log_probs in fitted.values():
        np.testing.assert_array_equal(log_probs.argmax(-1).numpy(), demonstrated)
    # the entropy of a discretised Gaussian of width 4 is about 2.8 nats; hard targets approach 0
    entropy = {sigma: float(-(lp.exp() * lp).sum(-1).mean()) for sigma, lp in fitted.items()}
    assert entropy[4.0] == pytest.approx(0.5 * np.log(2 * np.pi * np.e * 16), abs=0.3)
    assert entropy[0.0] < 1.0


def test_a_negative_label_width_is_refused_by_name():
    from embodied.core.errors import ConfigError

    with pytest.raises(ConfigError, match="policy.label_sigma_bins must be >= 0, got -1"):
        TokenVLAPolicy(TokenVLAConfig(label_sigma_bins=-1.0), SPEC)
