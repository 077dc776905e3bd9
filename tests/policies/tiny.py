"""The tiny pi0 that tests train from the command line: random weights at test sizes, with
room for ManiSkill's padded state (64 numbers) and actions (8); and the same in process."""

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


def tiny_pi0(spec, **settings):
    """The tiny pi0 built in this process for `spec`; `settings` are Pi0Config's."""
    from embodied.policies.pretrained.pi0 import Pi0Config, Pi0Policy

    base = dict(paligemma_variant="tiny", expert_variant="tiny_expert", vocab_size=300, critic_hidden=[8])
    return Pi0Policy(Pi0Config(**{**base, **settings}), spec)
