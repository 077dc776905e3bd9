"""The Hydra configs (YAML), shipped inside the package as `embodied.configs`."""
