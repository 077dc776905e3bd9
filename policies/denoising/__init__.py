"""Policies that denoise an action chunk: flow matching and diffusion over a state MLP, RL
through their per-step Gaussian likelihoods (`common.py` holds what both share)."""
