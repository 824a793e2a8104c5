"""A valid tiny checkpoint, damaged every way we can think of: each damage must end in exit code 2 and
one line on stderr, never a traceback. And prompts that are odd but valid must simply run."""

import json
import shutil
import time

import pytest
from conftest import DATA

from picospec.tools import cli

SOURCE = DATA / "tiny-hub"
HEADER_LENGTH = int.from_bytes((SOURCE / "model.safetensors").read_bytes()[:8], "little")
HEADER = json.loads((SOURCE / "model.safetensors").read_bytes()[8:8 + HEADER_LENGTH])
DATA_BYTES = (SOURCE / "model.safetensors").read_bytes()[8 + HEADER_LENGTH:]
ENTRY = "wte.weight"  # the entry damaged field by field
OTHER = next(k for k in HEADER if k not in (ENTRY, "__metadata__"))


def safetensors_bytes(header, data=DATA_BYTES, length=None) -> bytes:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


def with_entry(**fields):
    """The header with ENTRY's fields replaced (a value of ... removes the field)."""
    entry = {k: v for k, v in {**HEADER[ENTRY], **fields}.items() if v is not ...}
    return {**HEADER, ENTRY: entry}


begin, end = HEADER[ENTRY]["data_offsets"]
FILE_DAMAGE = {
    "empty file": b"",
    "length field only": (10).to_bytes(8, "little"),
    "header length 0": safetensors_bytes(HEADER, length=0),
    "header length past the end": safetensors_bytes(HEADER, length=1 << 40),
    "header length 2**64 - 1": safetensors_bytes(HEADER, length=(1 << 64) - 1),
    "header length cuts the JSON": safetensors_bytes(HEADER, length=HEADER_LENGTH // 2),
    "header not JSON": safetensors_bytes(b"{this is not json}"),
    "header a list": safetensors_bytes([HEADER]),
    "header a string": safetensors_bytes("header"),
    "header null": safetensors_bytes(None),
    "entry a number": safetensors_bytes({**HEADER, ENTRY: 7}),
    "entry a list": safetensors_bytes({**HEADER, ENTRY: [1, 2]}),
    "entry without dtype": safetensors_bytes(with_entry(dtype=...)),
    "entry without shape": safetensors_bytes(with_entry(shape=...)),
    "entry without data_offsets": safetensors_bytes(with_entry(data_offsets=...)),
    "dtype a number": safetensors_bytes(with_entry(dtype=4)),
    "dtype unknown": safetensors_bytes(with_entry(dtype="F7")),
    "dtype valid but not a float (I32)": safetensors_bytes(with_entry(dtype="I32")),
    "dtype BOOL": safetensors_bytes(with_entry(dtype="BOOL")),
    "shape a string": safetensors_bytes(with_entry(shape="300x24")),
    "shape negative": safetensors_bytes(with_entry(shape=[-300, 24])),
    "shape of floats": safetensors_bytes(with_entry(shape=[300.0, 24.0])),
    "shape too large for its bytes": safetensors_bytes(with_entry(shape=[301, 24])),
    "shape empty": safetensors_bytes(with_entry(shape=[])),
    "offsets strings": safetensors_bytes(with_entry(data_offsets=[str(begin), str(end)])),
    "offsets reversed": safetensors_bytes(with_entry(data_offsets=[end, begin])),
    "offsets negative": safetensors_bytes(with_entry(data_offsets=[-1, end])),
    "offsets past the end": safetensors_bytes(with_entry(data_offsets=[begin + 10 ** 9, end + 10 ** 9])),
    "offsets overlapping another": safetensors_bytes(with_entry(data_offsets=HEADER[OTHER]["data_offsets"])),
    "offsets three numbers": safetensors_bytes(with_entry(data_offsets=[begin, end, end])),
    "metadata not strings": safetensors_bytes({**HEADER, "__metadata__": {"format": 1}}),
    "data truncated": safetensors_bytes(HEADER, DATA_BYTES[:-100]),
    "data with extra bytes": safetensors_bytes(HEADER, DATA_BYTES + b"\0" * 64),
    "no data at all": safetensors_bytes(HEADER, b""),
}

CONFIG_DAMAGE = {
    "config not JSON": "{n_layer: 2",
    "config a list": [],
    "config n_head 0": {"n_head": 0},
    "config n_layer -1": {"n_layer": -1},
    "config n_embd a string": {"n_embd": "24"},
    "config vocab_size null": {"vocab_size": None},
    "config n_positions huge": {"n_positions": 10 ** 6},
    "config epsilon negative": {"layer_norm_epsilon": -1},
    "config eos out of range": {"eos_token_id": 300},
    "config another activation": {"activation_function": "relu"},
    "config another model": {"model_type": "llama"},
}

TOKENIZER_DAMAGE = {
    "tokenizer not JSON": "not json",
    "tokenizer a JSON list": "[1, 2, 3]",
    "tokenizer an empty object": "{}",
    "tokenizer larger than the vocabulary": "LARGER",
}


def damaged(tmp_path, case) -> str:
    folder = tmp_path / "ckpt"
    shutil.copytree(SOURCE, folder)
    weights = folder / "model.safetensors"
    if case in FILE_DAMAGE:
        weights.write_bytes(FILE_DAMAGE[case])
    elif case in CONFIG_DAMAGE:
        edit = CONFIG_DAMAGE[case]
        config = json.loads((folder / "config.json").read_text())
        text = edit if isinstance(edit, str) else json.dumps(edit if isinstance(edit, list) else {**config, **edit})
        (folder / "config.json").write_text(text)
    elif case == "tokenizer larger than the vocabulary":
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        vocab = tokenizer["model"]["vocab"]
        vocab.update({f"extra{i}": len(vocab) + i for i in range(5)})
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    elif case in TOKENIZER_DAMAGE:
        (folder / "tokenizer.json").write_text(TOKENIZER_DAMAGE[case])
    elif case == "weights file is a folder":
        weights.unlink()
        weights.mkdir()
    elif case == "weights a dangling symlink":
        weights.unlink()
        weights.symlink_to(folder / "nowhere.safetensors")
    elif case == "weights a looping symlink":
        weights.unlink()
        (folder / "loop").symlink_to(weights)
        weights.symlink_to(folder / "loop")
    elif case == "config a folder":
        (folder / "config.json").unlink()
        (folder / "config.json").mkdir()
    return str(folder)


PATH_DAMAGE = ["weights file is a folder", "weights a dangling symlink", "weights a looping symlink",
               "config a folder"]
CASES = [*FILE_DAMAGE, *CONFIG_DAMAGE, *TOKENIZER_DAMAGE, *PATH_DAMAGE]


@pytest.mark.parametrize("case", CASES)
def test_damage_is_one_line_and_exit_2(capsys, tmp_path, case):
    folder = damaged(tmp_path, case)
    t0 = time.perf_counter()
    code = cli.main(["--draft", folder, "--target", folder, "--n-tokens", "2", "--prompt", "Hi"])
    _, err = capsys.readouterr()
    assert code == 2, (case, err)
    assert err.count("\n") == 1 and err.startswith("picospec: error: ") and "Traceback" not in err, err
    assert time.perf_counter() - t0 < 30  # a refusal, not a long computation


def test_the_undamaged_copy_runs(capsys, tmp_path):
    folder = damaged(tmp_path, "none")
    assert cli.main(["--draft", folder, "--target", folder, "--n-tokens", "2", "--prompt", "Hi"]) == 0


ODD_PROMPTS = {
    "control characters": "a\x00b\x07c\x1b[31m",
    "emoji": "I 🙂 🏳️‍🌈 you",
    "combining marks": "e\u0301 n\u0303 a\u0308\u0304",
    "byte-order mark": "\ufeffHello",
    "whitespace only": " \t\n  ",
    "endoftext inside": "one<|endoftext|>two",
    "right-to-left": "שלום مرحبا",
}


@pytest.mark.parametrize("case", ODD_PROMPTS)
def test_odd_but_valid_prompts_run(capsys, case):
    code = cli.main(["--draft", str(SOURCE), "--target", str(SOURCE), "--n-tokens", "3", "--prompt", ODD_PROMPTS[case],
                     "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) == 3
