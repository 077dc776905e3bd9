"""Errors a user can act on. Each names what was wrong and what would be accepted."""


class EmbodiedError(Exception):
    """Base class: the CLI prints these without a traceback."""


class ConfigError(EmbodiedError):
    """A config key, value or type that cannot be used."""


class CheckpointError(EmbodiedError):
    """A checkpoint that is missing, incomplete or incompatible."""


class UnknownNameError(ConfigError):
    """A registry lookup for a name nobody registered."""


class EnvWorkerError(RuntimeError):
    """An env worker process failed, died or stopped answering. A RuntimeError, not an
    EmbodiedError: the runtimes catch it to restart the worker, and it is no user's mistake."""
