"""Checkpoints: finding one (bundled, a local folder or the Hugging Face hub) and loading it as a Model
(weights.py), its safetensors files (tensors.py) and its config.json (config.py)."""
