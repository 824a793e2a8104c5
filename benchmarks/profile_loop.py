"""Where a speculative iteration's time goes: the real loop against its forward calls alone, op by op.

    python benchmarks/profile_loop.py [K ...]        # default: 2 4 6

On the bundled pair, float32, temperature 0.8, 128 tokens (caches of 256 slots, as notebook 3's runs),
traces with jax.profiler (5 runs after 3 warm-ups) the real loop (`speculative._speculative`) and
`timing._iteration_calls` (K one-token draft calls then the (K+1)-token target call, as they alternate,
nothing else: what notebook 3's second prediction times). Every executed XLA operation is assigned to
the picospec function that emitted it, from the compiled program's own source locations:

  draft, 2-token call   `propose`'s first forward call (the draft catching up after a full accept)
  draft, 1-token calls  the other draft calls
  draft sampling        the draft's logits_to_probs and sample
  target call           the (K+1)-token forward call
  verification          the target's logits_to_probs, accept_or_resample, the trace and the rest

Times are summed over both threads (so the columns add up to more than the wall time) and divided
by the iterations; "waits" is the time threads spent waiting on the GEMM library's pool.
"""

import collections
import re
import sys

import jax
import jax.numpy as jnp
from profile_forward import traced_ops  # benchmarks/, beside this script

import picospec
import picospec.speculative as spec
from picospec.gpt2 import forward, init_cache
from picospec.sampling import Sampling, buffers
from picospec.tools.timing import _iteration_calls

N_TOKENS, PROMPT, WARM, RUNS = 128, "And the LORD spake unto Moses, saying", 3, 5
GROUPS = ["draft, 2-token call", "draft, 1-token calls", "draft sampling", "target call", "verification", "waits",
          "unattributed"]


def functions_of(hlo: str) -> dict:
    """{instruction name: the function names on its stack, innermost last} from the compiled HLO text."""
    section = lambda title: re.search(rf"^{title}\n(.*?)(?:\n\n|\Z)", hlo, re.S | re.M).group(1)  # noqa: E731
    names = dict(re.findall(r'^(\d+) "(.*)"', section("FunctionNames"), re.M))
    where = {i: names[f] for i, f in re.findall(r"^(\d+) \{file_name_id=\d+ function_name_id=(\d+)", section("FileLocations"), re.M)}
    # Each frame names its parent as (parent's id + 1); 1 marks the outermost frame.
    frames = {int(i): (where[loc], int(parent or 1) - 1) for i, loc, parent in
              re.findall(r"^(\d+) \{file_location_id=(\d+)(?: parent_frame_id=(\d+))?", section("StackFrames"), re.M)}

    def chain(frame):  # function names, outermost first
        out = []
        while frame in frames and len(out) < 64:
            name, frame = frames[frame]
            out.append(name.rpartition(".")[2])  # "propose.<locals>.draft_step" -> "draft_step"
        return out[::-1]
    stacks, computation, members = {}, None, collections.defaultdict(list)
    for line in hlo.splitlines():
        if re.match(r"^(ENTRY )?%?[\w.-]+ .*\{$", line):
            computation = line.split()[-3] if line.startswith("ENTRY") else line.split()[0]
        elif m := re.match(r"^\s*(?:ROOT )?%?([\w.-]+) = ", line):
            members[computation].append(m.group(1))
            if frame := re.search(r"stack_frame_id=(\d+)", line):
                stacks[m.group(1)] = chain(int(frame.group(1)))
    # XLA leaves some instructions without a source location (plain dots, and the fusions of cumsum,
    # for two). A dot takes the group of its computation's forward-call instructions when they are all
    # in one group; the rest stay "unattributed".
    for names in members.values():
        calls = {group(stacks[n]) for n in names if n in stacks and "forward" in stacks[n]}
        for n in names:
            if n not in stacks and n.startswith("dot") and len(calls) == 1:
                stacks[n] = next(stacks[k] for k in names if k in stacks and group(stacks[k]) in calls)
    return stacks


def group(stack: list) -> str:
    if "draft_step" in stack or "draft_call" in stack:
        return "draft, 1-token calls" if "forward" in stack else "draft sampling"
    if "propose" in stack:
        return "draft, 2-token call" if "forward" in stack else "draft sampling"
    if "forward" in stack and ("score" in stack or "iteration" in stack):
        return "target call"
    return "verification"


def profile(fn, lowered, iterations: int) -> tuple[float, collections.Counter]:
    """(wall seconds per iteration, {group: summed seconds per iteration}) over RUNS traced calls of fn."""
    functions = functions_of(lowered.compile().as_text())
    for _ in range(WARM):
        fn()
    wall, ops = traced_ops(fn, RUNS)
    groups = collections.Counter()
    for name, seconds in ops.items():
        key = "waits" if "Await" in name else group(functions[name]) if name in functions else "unattributed"
        groups[key] += seconds / iterations
    return wall / iterations, groups


def main():
    Ks = [int(k) for k in sys.argv[1:]] or [2, 4, 6]
    draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
    prompt = picospec.load_tokenizer("tiny-target").encode(PROMPT).ids
    print(f"bundled pair, float32, T = 0.8, {N_TOKENS} tokens; {jax.devices()[0].device_kind}; "
          "ms per iteration (groups summed over threads)")
    print(f"{'':6} {'loop':22} {'wall':>6}  " + "  ".join(f"{g:>20}" for g in GROUPS))
    for K in Ks:
        tokens, prefill_len, max_len = buffers(prompt, N_TOKENS, K, target.config)
        args = (draft, target, tokens, len(prompt), jax.random.key(0), N_TOKENS, K, Sampling(0.8), prefill_len,
                max_len, -1)
        n = int(spec._speculative(*args)[1].n_steps)

        def cached(model):  # 32 positions in a cache the size the runs use
            return forward(model.params, jnp.zeros(32, jnp.int32), init_cache(model.config, max_len), model.config)[1]
        calls = (draft, target, K, jnp.int32(n), cached(draft), cached(target))
        loops = {"the real loop": (lambda: spec._speculative(*args)[0].block_until_ready(), spec._speculative.lower(*args)),
                 "its calls alone": (lambda: _iteration_calls(*calls).block_until_ready(), _iteration_calls.lower(*calls))}
        for name, (fn, lowered) in loops.items():
            wall, groups = profile(fn, lowered, n)
            print(f"K = {K:<2} {name:22} {wall * 1e3:6.2f}  " + "  ".join(f"{groups[g] * 1e3:20.3f}" for g in GROUPS))


if __name__ == "__main__":
    main()
