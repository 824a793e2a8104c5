"""`python -m picospec.bench`: the short name for picospec/tools/bench.py."""

from picospec.tools.bench import main

if __name__ == "__main__":
    main()
