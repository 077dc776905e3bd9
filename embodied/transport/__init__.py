"""Wire formats between roles. No pickle anywhere: msgpack plus raw numpy buffers."""
