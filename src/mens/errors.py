"""The MensError hierarchy: every failure a user can cause, with the exit code the CLI maps it to.

A good message says what failed, where (file:line or flag), the value seen vs expected, and what to do.
"""


class MensError(Exception):
    """Base of every error mens reports to a user (one line, no traceback; exit code 2)."""

    exit_code = 2


class UsageError(MensError, ValueError):
    """A flag or argument is wrong (bad value, missing path)."""


class ConfigError(MensError, ValueError):
    """A config or preset file, or a key in it, is invalid."""


class DataError(MensError, ValueError):
    """Input data is missing, malformed or too small."""


class ModelError(MensError, RuntimeError):
    """A base model, tokenizer or adapter cannot be loaded or does not fit."""


class GateFailed(MensError):
    """A quality gate or threshold was not met (exit code 1, like a failing check)."""

    exit_code = 1
