"""``python -m tsnap.bench``: runs ``tsnap.bench.main`` with the command line's arguments."""

import sys

from . import main

sys.exit(main())
