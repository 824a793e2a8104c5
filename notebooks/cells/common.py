"""The first code cell of every notebook: pick the pair, load it."""

SETUP = '''\
MODELS = "bundled"  # "bundled": the offline tiny pair; "gpt2": GPT-2 124M drafting for 1558M (hub or cache)
DRAFT, TARGET = {"bundled": ("tiny-draft", "tiny-target"), "gpt2": ("gpt2", "gpt2-xl")}[MODELS]

import jax
import numpy as np
import picospec
from IPython.display import HTML, display

draft, target = picospec.load_model(DRAFT), picospec.load_model(TARGET)
tokenizer = picospec.load_tokenizer(TARGET)
print(f"draft {DRAFT}: {draft.config.n_layer} layers x {draft.config.n_embd}; "
      f"target {TARGET}: {target.config.n_layer} layers x {target.config.n_embd}")'''

NAMES = """\
Two figures are easy to confuse, so each has one name here, in the CLI and in the benchmark:
the **acceptance rate** is accepted drafts / drafted tokens (the dropped drafts after a rejection count
as not accepted); **α** is the probability that one drafted token, once it is tested, is accepted —
Σ_x min(p(x), q(x)) at a position, or estimated from a trace as accepted / tested."""
