import sys

from picospec.tools.cli import main

sys.exit(main())
