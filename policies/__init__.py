"""Policies behind one contract (`policies.base.Policy`): act, evaluate, value, bc_loss."""
