"""The benchmark's other contender: transformers (PyTorch), timed the same way as picospec, on the
same kind of device: on CUDA when JAX runs on a GPU (torch built with CUDA), on the CPU when JAX
does. Each function returns None when torch or transformers is not installed, or when torch cannot
reach the device picospec runs on (a race of unlike with unlike says nothing)."""

import jax
from timing import race


def torch_device() -> str | None:
    """The torch device matching JAX's: "cuda" or "cpu"; None if torch is missing or has no CUDA
    while JAX runs on a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if jax.devices()[0].platform == "gpu":
        return "cuda" if torch.cuda.is_available() else None
    return "cpu" if jax.devices()[0].platform == "cpu" else None


def synchronized(run, device: str):
    """run, then wait for the device (CUDA calls return before the work is done)."""
    import torch

    def timed():
        run()
        if device == "cuda":
            torch.cuda.synchronize()
    return timed


def transformers_model(folder: str, dtype: str = "float32"):
    """(torch, the checkpoint as transformers' GPT2LMHeadModel on torch_device(), that device), or None
    without torch and transformers, or without the device."""
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError:
        return None
    if (device := torch_device()) is None:
        return None
    model = GPT2LMHeadModel.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype))
    return torch, model.eval().to(device), device


def transformers_decode(folder: str, prompt, dtype: str, m: int):
    """The same with transformers' generate (use_cache=True); None if it is not installed."""
    if (loaded := transformers_model(folder, dtype)) is None:
        return None
    torch, model, device = loaded
    ids = torch.tensor([prompt], device=device)

    def run():
        with torch.no_grad():
            model.generate(ids, max_new_tokens=m, min_new_tokens=m, do_sample=False, use_cache=True,
                           pad_token_id=0)
    return synchronized(run, device)


def transformers_assisted(draft_folder: str, target_folder: str, prompt, K: int, n=64):
    """transformers' assisted generation (greedy, a constant K drafts): its speedup over its own
    plain generate; None without transformers."""
    if (loaded := transformers_model(target_folder)) is None:
        return None
    torch, target, device = loaded
    draft = transformers_model(draft_folder)[1]
    ids = torch.tensor([prompt], device=device)
    common = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    assist = dict(assistant_model=draft, num_assistant_tokens=K, num_assistant_tokens_schedule="constant",
                  assistant_confidence_threshold=0.0)
    with torch.no_grad():
        t, _ = race(plain=synchronized(lambda: target.generate(ids, **common), device),
                    assisted=synchronized(lambda: target.generate(ids, **common, **assist), device))
    return {"plain_seconds": t["plain"], "assisted_seconds": t["assisted"], "speedup": t["plain"] / t["assisted"]}


def transformers_batch_generate(folder: str, prompts, n: int, dtype="float32"):
    """transformers' batched generate of n tokens after each prompt: left-padded (GPT-2 has no pad
    token; id 0 with attention_mask 0), greedy, use_cache=True. None without transformers."""
    if (loaded := transformers_model(folder, dtype)) is None:
        return None
    torch, model, device = loaded
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    def run():
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           use_cache=True, pad_token_id=0)
    return synchronized(run, device)
