"""Policies behind one contract (`embodied.core.policy.Policy`): act, recompute, value, bc_loss.

By family: `gaussian/` (MLP, SAC's squashed actor, DSRL's noise actor), `denoising/` (flow,
diffusion), `vla/` (the built-in VLAs), `pretrained/` (pi0, SmolVLA, OpenVLA from their
published layouts). What several families use sits here: the frozen image backbones
(`image_backbones.py`), the pretrained encoders (`encoders.py`) and the running input
normaliser (`normalization.py`)."""
