"""The one error type every layer raises for input a user can fix (printed as one line)."""


class SketchWalkError(ValueError):
    """Bad input or a fixable situation; str(exc) is a single line meant for the user."""


class ConfigError(SketchWalkError):
    """A knob is out of range; the message is one line meant for the user."""
