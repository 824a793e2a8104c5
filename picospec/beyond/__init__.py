"""Part II: after the paper. Each chapter changes one piece of Part I's iteration (the draft, the target's
call, the verifier) or the iteration itself, and runs on the one loop they share (loop.py)."""
