"""The three roles (env side, rollout, learner) and the runtimes that place them."""
