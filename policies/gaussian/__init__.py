"""Gaussian policies: the MLP actor-critic (PPO), the tanh-squashed actor of SAC/RLPD (state or
pixels through a frozen backbone), and DSRL's actor over a frozen flow's initial noise."""
