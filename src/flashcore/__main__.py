"""``python -m flashcore ...``: the ``flashcore`` command."""
import sys

from .cli import main

sys.exit(main())
