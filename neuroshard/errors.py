"""The one exception type that scripts turn into a single clear line on stderr."""


class UserError(Exception):
    """Bad input or environment: the message names the problem and the fix."""
