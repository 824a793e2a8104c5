"""The bundled pair, tiny-draft and tiny-target (README.md here): shipped in the wheel as picospec.weights."""
