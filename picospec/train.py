"""`python -m picospec.train`: the short name for picospec/tools/train.py."""

from picospec.tools.train import main

if __name__ == "__main__":
    main()
