"""Policies behind one contract (`embodied.core.policy.Policy`): act, evaluate, value, bc_loss."""
