"""The command line's flags: `picospec --help` lists them. A bad one is a one-line error, exit code 2."""

import argparse

from picospec.beyond.tree import CHILDREN
from picospec.beyond.verifiers import RULES
from picospec.errors import PicospecError
from picospec.tools.checkpoints.weights import DTYPES
from picospec.tools.cli.options import AUTO_K_MAX, k_value


def parse_args(argv):
    description = "speculative sampling on GPT-2 (124M drafting for 1558M), streamed and coloured."
    parser = argparse.ArgumentParser(prog="picospec", description=description)
    parser.add_argument("--prompt", action="append", help="the text to continue; empty starts from <|endoftext|>; "
                        "give it several times to run the prompts as one batch")
    parser.add_argument("--prompt-file", help="one prompt a line (- reads standard input), run as one batch")
    parser.add_argument("--draft", default="gpt2", help="draft model: name, hub repo or folder (default gpt2, 124M); "
                        "an EAGLE head trained for the target (tiny-head); or ngram for n-gram lookup")
    parser.add_argument("--ngram-max", type=int, default=3, help="with --draft ngram: longest n-gram tried (default 3)")
    parser.add_argument("--target", default="gpt2-xl", help="target model (default gpt2-xl, 1558M)")
    parser.add_argument("--n-tokens", type=int, default=40, help="tokens to generate (default 40)")
    parser.add_argument("--K", type=k_value, default=4, help="tokens drafted per target call (default 4); auto: "
                        f"chosen each call, up to {AUTO_K_MAX}, from this machine's costs and the acceptance so far")
    parser.add_argument("--confidence", type=float, default=0.0, help="stop drafting after a token the draft gives "
                        "less than this probability (default 0: never)")
    parser.add_argument("--drafts", type=int, default=1, help="draft chains verified per target call "
                        "(default 1; more need --verify match or token and a whole-number K)")
    parser.add_argument("--tree", type=int, metavar="M", help="draft a token tree of M nodes a target call, its "
                        "shape the best for M by theory (tree.py); --K is then M")
    parser.add_argument("--children", choices=[*CHILDREN, "dynamic"], default="iid",
                        help="with --tree: a node's children drawn independently (iid), the most probable (top), "
                        "drawn without replacement (distinct), or the tree grown each call where the draft is "
                        "confident (dynamic, EAGLE-2); with --drafts N: how the chains' first tokens are chosen")
    parser.add_argument("--verify", choices=list(RULES), default="token",
                        help="how drafts are checked: match, token (min(1, q/p)) or block (default token)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (default 1: all)")
    parser.add_argument("--seed", type=int, default=0, help="jax.random seed (default 0)")
    parser.add_argument("--mode", choices=["speculative", "autoregressive", "compare"], default="speculative",
                        help="compare runs both and reports the speedup (default speculative)")
    parser.add_argument("--dtype", help=f"one of {', '.join(DTYPES)} (default float32 on a CPU, bfloat16 on a GPU "
                        "or TPU, with float32 logits)")
    parser.add_argument("--stop-at-eos", action="store_true", help="stop early at <|endoftext|>")
    parser.add_argument("--platform", choices=["cpu", "gpu", "tpu"], help="where to run (default: JAX's choice, "
                        "an accelerator when one is installed)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of streaming text (one object; "
                        "a batch: one line per row as it finishes, then one with the summary)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw every iteration's accept and reject as a grid "
                        "(a batch: one file per prompt, FILE-1.png, FILE-2.png, ...); needs matplotlib")
    parser.error = _fail  # one line, exit code 2: no usage dump
    return parser.parse_args(argv)


def _fail(message):
    raise PicospecError(message)
