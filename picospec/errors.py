"""The one exception picospec raises for things a user can fix."""


class PicospecError(Exception):
    """Bad input: a missing model, a corrupt file, an out-of-range option.

    The message is a single line that says what is wrong and what to do. The CLI prints it
    (no traceback) and exits with code 2.
    """
