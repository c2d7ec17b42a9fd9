"""``python -m flashcore.audit.sass``: the SASS gate on its own (a JSON report only with ``--json PATH``)."""
import sys

from .cli import main

sys.exit(main())
