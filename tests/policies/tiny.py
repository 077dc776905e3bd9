"""The tiny pi0 that tests train from the command line: random weights at test sizes, with
room for ManiSkill's padded state (64 numbers) and actions (8)."""

TINY_PI0 = (
    "policy=pi0",
    "policy.paligemma_variant=tiny",
    "policy.expert_variant=tiny_expert",
    "policy.vocab_size=300",
    "policy.max_state_dim=64",
    "policy.max_action_dim=8",
    "policy.horizon=2",
    "policy.denoise_steps=2",
)
