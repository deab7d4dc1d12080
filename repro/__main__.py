import sys

from repro.cli.main import main

sys.exit(main())
