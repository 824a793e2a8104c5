"""The CLI's programs (picospec/tools/programs.py): each compiled once a process, again for another
static option, the newest KEPT_HERE kept; --K auto's prior laws from them are the model's own."""

import importlib
import json
from collections import OrderedDict

import jax.numpy as jnp
import numpy as np
from test_cli import PAIR, run_cli

from picospec import load_model
from picospec.beyond.policy import Policy
from picospec.gpt2 import logits
from picospec.sampling import Sampling, logits_to_probs
from picospec.tools import programs
from picospec.tools.cli import options

stream = importlib.import_module("picospec.tools.cli.stream")  # the module (the package names its function stream)
RUN = [*PAIR, "--prompt", "To be", "--n-tokens", "10", "--K", "3", "--json"]


def test_a_process_compiles_each_program_once_and_another_static_option_again(capsys, monkeypatch):
    """A later run in the same process (a notebook's) reuses the programs it built, and gives the same
    tokens; K is static (another program), the temperature is not (greedy or not is); the newest
    KEPT_HERE are kept."""
    monkeypatch.setattr(programs, "BUILT_HERE", OrderedDict())
    code, first, _ = run_cli(capsys, *RUN)
    built = dict(programs.BUILT_HERE)
    assert code == 0 and len(built) == 2  # the batched start and one iteration
    code, again, _ = run_cli(capsys, *RUN)
    assert code == 0 and json.loads(again)["tokens"] == json.loads(first)["tokens"]
    assert dict(programs.BUILT_HERE) == built  # the same compiled programs, none added
    run_cli(capsys, *RUN, "--temperature", "0.7")
    run_cli(capsys, *RUN, "--temperature", "0.9")
    assert len(programs.BUILT_HERE) == 3  # sampled: another iteration; 0.7 and 0.9 share it
    run_cli(capsys, *[x if x != "3" else "2" for x in RUN])
    assert len(programs.BUILT_HERE) == 5  # K = 2: another start and iteration
    monkeypatch.setattr(programs, "KEPT_HERE", 2)
    run_cli(capsys, *[x if x != "3" else "1" for x in RUN])
    assert len(programs.BUILT_HERE) == 2 and not set(programs.BUILT_HERE) & set(built)  # K = 1's alone kept


def test_auto_reads_its_prior_from_one_program_a_padded_length():
    """--K auto's prior: the laws at the prompt's positions (options.law) from one padded call are the
    model's own laws there; a second prompt of the same padded length compiles nothing new, and whether
    the prior alone stops the draft (stream.asked) is one program too."""
    draft, sampling = load_model("tiny-draft"), Sampling(0.8)
    programs.BUILT_HERE.clear()
    laws = options.law(draft, [[5, 7, 9]], sampling)[0]
    np.testing.assert_allclose(laws, logits_to_probs(logits(draft, [5, 7, 9]), sampling), atol=1e-6)
    built = len(programs.BUILT_HERE)
    options.law(draft, [[4, 2]], sampling)
    assert len(programs.BUILT_HERE) == built == 1
    policy = Policy(jnp.float32(0), jnp.float32([2.0, 1.0]), jnp.float32(0), prior=jnp.float32([3.0, 1.0]))
    assert bool(stream.asked(policy, 2)) == bool(stream.asked(policy, 2)) and len(programs.BUILT_HERE) == 2
