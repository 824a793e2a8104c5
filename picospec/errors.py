"""The one exception picospec raises for things a user can fix."""


class PicospecError(Exception):
    """Bad input: a missing model, a corrupt file, an out-of-range option.

    The message is a single line that says what is wrong and what to do. The CLI prints it
    (no traceback) and exits with code 2.
    """


class NonFiniteLogits(PicospecError):
    """A model's logits held NaN or Inf while sampling (float16 overflows past 65504): what it sampled
    is garbage. `which` is "draft" or "target"."""

    def __init__(self, which: str, dtype):
        self.which, self.dtype = which, str(dtype)
        super().__init__(f"the {which}'s logits became NaN or Inf while sampling ({self.dtype} overflowed): "
                         "load it as bfloat16 or float32")
