"""Host round trips in a compiled sampler, counted from its jaxpr (on XLA:GPU each one drains the queue of kernel
launches). A `cond` or `switch` whose index is computed at run time copies it to the host and waits, and so
does every trip of a `while` (XLA evaluates its condition on the device and reads it back); a `scan` of static
length does neither, nor a branch lax.platform_dependent picks as it lowers. The generation loop is the
outermost `while`; one of its iterations costs its own condition, 1, plus the round trips of its body."""

import jax
from jax.extend.core import Literal


def jaxprs(params) -> list:
    """The sub-jaxprs an equation's params hold (branches, bodies, called functions)."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else [value]:
            if hasattr(item, "eqns"):
                found.append(item)
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                found.append(item.jaxpr)
    return found


def trips(jaxpr, on: str = "cuda") -> int:
    """Round trips one run of `jaxpr` makes when lowered for platform `on`, each inner `while` counted as
    one trip (its count is unknown: any inner while is already too many)."""
    n, chosen = 0, {}  # chosen: the branch lax.platform_dependent's index picks for `on`, by its variable
    for eqn in jaxpr.eqns:
        subs = jaxprs(eqn.params)
        if eqn.primitive.name == "platform_index":
            names = eqn.params["platforms"]  # a tuple of platform-name tuples; None: the default
            chosen[eqn.outvars[0]] = next((i for i, p in enumerate(names) if p and on in p),
                                          next((i for i, p in enumerate(names) if p is None), 0))
        elif eqn.primitive.name == "cond" and eqn.invars[0] in chosen:
            n += trips(subs[chosen[eqn.invars[0]]], on)
        elif eqn.primitive.name == "cond":
            n += (not isinstance(eqn.invars[0], Literal)) + max(trips(b, on) for b in subs)
        elif eqn.primitive.name == "while":
            n += 1 + sum(trips(j, on) for j in subs)
        elif eqn.primitive.name == "scan":
            n += eqn.params["length"] * sum(trips(j, on) for j in subs)
        else:
            n += sum(trips(j, on) for j in subs)
    return n


def outermost_while(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            return eqn
        for sub in jaxprs(eqn.params):
            if (found := outermost_while(sub)) is not None:
                return found
    return None


def per_iteration(fn, *args, on: str = "cuda") -> int:
    """Round trips per iteration of the generation loop that fn(*args) runs, lowered for platform `on`:
    its condition and its body."""
    loop = outermost_while(jax.make_jaxpr(fn)(*args).jaxpr)
    return 1 + sum(trips(j, on) for j in jaxprs(loop.params))
