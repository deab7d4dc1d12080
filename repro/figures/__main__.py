"""``python -m repro.figures {run,index,list}``; see :mod:`repro.figures.runner`."""

import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main())
