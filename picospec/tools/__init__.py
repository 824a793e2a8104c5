"""The tools around the lesson: loading checkpoints, the CLI and its streaming, the benchmark and its
timing, training the bundled pair, and notebook display. The lesson itself is one folder up."""
