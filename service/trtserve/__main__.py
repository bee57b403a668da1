import sys

from trtserve.cli import main

# Guarded: the supervisor's child processes are spawned, and spawn imports this module again.
if __name__ == "__main__":
    sys.exit(main())
