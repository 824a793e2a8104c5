"""The benchmark's other contender: transformers (PyTorch), timed the same way as picospec. Each
function returns None when torch or transformers is not installed."""

from picospec.tools.timing import race


def transformers_decode(folder: str, prompt, dtype: str, m: int):
    """The same with transformers' generate (use_cache=True); None if it is not installed."""
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError:
        return None
    model = GPT2LMHeadModel.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype)).eval()
    ids = torch.tensor([prompt])

    def run():
        with torch.no_grad():
            model.generate(ids, max_new_tokens=m, min_new_tokens=m, do_sample=False, use_cache=True,
                           pad_token_id=0)
    return run


def transformers_assisted(draft_folder: str, target_folder: str, prompt, K: int, n=64):
    """transformers' assisted generation (greedy, a constant K drafts): its speedup over its own
    plain generate; None without transformers."""
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError:
        return None
    target = GPT2LMHeadModel.from_pretrained(target_folder, local_files_only=True).eval()
    draft = GPT2LMHeadModel.from_pretrained(draft_folder, local_files_only=True).eval()
    ids = torch.tensor([prompt])
    common = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    assist = dict(assistant_model=draft, num_assistant_tokens=K, num_assistant_tokens_schedule="constant",
                  assistant_confidence_threshold=0.0)
    with torch.no_grad():
        t, _ = race(plain=lambda: target.generate(ids, **common),
                    assisted=lambda: target.generate(ids, **common, **assist))
    return {"plain_seconds": t["plain"], "assisted_seconds": t["assisted"], "speedup": t["plain"] / t["assisted"]}


def transformers_batch_generate(folder: str, prompts, n: int, dtype="float32"):
    """transformers' batched generate of n tokens after each prompt: left-padded (GPT-2 has no pad
    token; id 0 with attention_mask 0), greedy, use_cache=True. None without transformers."""
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError:
        return None
    model = GPT2LMHeadModel.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype)).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def run():
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           use_cache=True, pad_token_id=0)
    return run
