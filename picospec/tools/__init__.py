"""The tools around the lesson (which is one folder up), grouped by what they serve:
  checks.py      every check of what a user asks for, with its one-line message
  samplers.py    the public entry points: the lesson's samplers, checked, their options made plug-ins
  checkpoints/   finding and loading checkpoints (safetensors, config.json, tokenizer)
  cli/           the `picospec` command: options, the stream, what it shows
  autotune/      --K auto's costs and prior, made for this machine, pair and batch
  programs.py, jit_cache.py   compiled once a process, and once a machine (JAX's persistent cache)
  train/         `python -m picospec.tools.train`: training the bundled pair
  memory.py, sharding.py   devices: refusing batches that do not fit, splitting them over several
"""
