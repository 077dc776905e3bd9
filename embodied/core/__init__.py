"""The core every role shares: data types, errors, registries, the env and policy contracts,
and the wire protocol (codec, envelope, message bodies, sockets, CURVE keys). It imports
nothing above it and no torch at module level, so env workers and robot clients use it alone."""
