"""`python -m jaxphylo.cli`."""

import sys

from . import main

sys.exit(main())
