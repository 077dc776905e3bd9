"""Reinforcement-learning fine-tuning of robot policies: one system from simulation to robot."""

__version__ = "0.1.0"
