"""`python -m switchboard`: the CLI. The guard matters: engines spawn processes that re-import main."""

import sys

from switchboard.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
