import sys

from picospec.cli import main

sys.exit(main())
