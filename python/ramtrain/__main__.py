"""python -m ramtrain: the ramtrain command line, in this process."""
import sys

from . import cli

if __name__ == "__main__":
    sys.exit(cli())
