"""Policies behind one contract (`embodied.core.policy.Policy`): act, recompute, value, bc_loss."""
