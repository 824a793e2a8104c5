"""The tools around the lesson (which is one folder up), grouped by what they serve:
  checks.py      every check of what a user asks for, with its one-line message
  samplers.py    the public entry points: the lesson's samplers, checked, their options made plug-ins
  checkpoints/   finding and loading checkpoints (safetensors, config.json, tokenizer)
  cli/           the `picospec` command: options, the stream, what it shows, --K auto's costs, the jit cache
  bench/         `python -m picospec.tools.bench`: picospec against transformers, timed in one run
  train/         `python -m picospec.tools.train`: training the bundled pair
  memory.py, sharding.py   devices: refusing batches that do not fit, splitting them over several
"""
