"""The bundled pair's text: the King James Bible (Debian's bible-kjv), split by chapter, every 20th
held out, and a byte-level BPE tokenizer trained on the rest."""

import re
import subprocess
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 2048  # the bundled pair's vocabulary


def corpus() -> tuple[str, str]:
    """The KJV text, one verse a line, split by chapter: every 20th chapter is held out."""
    try:
        raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("picospec.tools.train: the corpus needs Debian's bible-kjv (apt-get install bible-kjv)")
    chapters = {}
    for line in raw.splitlines():
        if m := re.match(r"(\w+?\d*:)(\d+) (.*)", line):  # "Ge1:1 In the beginning ..."
            chapters.setdefault(m[1], []).append(m[3])
    texts = ["\n".join(verses) for verses in chapters.values()]
    train = [t for i, t in enumerate(texts) if i % 20]
    return "\n<|endoftext|>".join(train), "\n<|endoftext|>".join(texts[::20])


def train_tokenizer(text: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text.split("\n"), trainer)
    return tokenizer


def write_heldout_sample(held_text: str, path: Path, n_chapters=8):
    """A few held-out chapters, kept beside the weights so tests can measure the pair on unseen text."""
    path.write_text("\n<|endoftext|>".join(held_text.split("\n<|endoftext|>")[1:1 + n_chapters]) + "\n")
