"""Regenerate tests/data: small random GPT-2 checkpoints written by transformers, and its logits.

Needs torch and transformers (`pip install torch==2.13.0 transformers`); the test suite itself does
not. Run from the repo root: `python tests/make_reference_data.py`.

Writes, for each model below, tests/data/<name>/{config.json, model.safetensors, tokenizer.json} and
tests/data/<name>/reference.safetensors holding fixed input tokens and transformers' logits for them.
  - tiny-prefixed: `save_pretrained` as is: keys `transformer.h.0...`, head tied and not stored.
  - tiny-hub: the layout of the hub's openai-community files: bare keys `h.0...`, plus each layer's
    `attn.bias` / `attn.masked_bias` mask buffers. Odd head count (3), like gpt2-xl's 25.
  - tiny-sharded: tiny-prefixed's model saved in shards (`save_pretrained(max_shard_size=...)`):
    model.safetensors.index.json and the shards it lists.
"""

from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel

DATA = Path(__file__).parent / "data"
VOCAB = 300
TEXT = ("The quick brown fox jumps over the lazy dog. A stitch in time saves nine. "
        "To be or not to be, that is the question. All that glitters is not gold. ") * 20


def make_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT], trainer)
    assert tokenizer.get_vocab_size() == VOCAB, tokenizer.get_vocab_size()
    return tokenizer


def make_model(n_head: int, seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_head=n_head, n_embd=8 * n_head, n_positions=64, vocab_size=VOCAB,
                        bos_token_id=0, eos_token_id=0)  # <|endoftext|> is token 0 here
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # weights far from init, so the logits are not near-uniform
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("ln_1.weight") or
                    name.endswith("ln_2.weight") or name.endswith("ln_f.weight") else 0.2 * torch.randn_like(p))
    return model


def main():
    tokenizer = make_tokenizer()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(3, 40)).astype(np.int64)  # 3 fixed inputs of 40 tokens
    for name, n_head, seed in [("tiny-prefixed", 4, 1), ("tiny-hub", 3, 2), ("tiny-sharded", 4, 1)]:
        folder = DATA / name
        model = make_model(n_head, seed)
        model.save_pretrained(folder, max_shard_size="40KB" if name == "tiny-sharded" else "5GB")
        (folder / "generation_config.json").unlink(missing_ok=True)
        if name == "tiny-hub":  # rewrite the weights in the hub's bare-key layout, with mask buffers
            tensors = {k.removeprefix("transformer."): v.numpy() for k, v in model.state_dict().items()
                       if k != "lm_head.weight"}
            n_pos = model.config.n_positions
            for i in range(model.config.n_layer):
                tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((n_pos, n_pos), np.float32))[None, None]
                tensors[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
            save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        tokenizer.save(str(folder / "tokenizer.json"))
        with torch.no_grad():
            logits = model(torch.from_numpy(tokens)).logits.numpy()  # [3, 40, VOCAB]
        save_file({"tokens": tokens.astype(np.int32), "logits": logits}, folder / "reference.safetensors")
        print(f"wrote {folder}")


if __name__ == "__main__":
    main()
