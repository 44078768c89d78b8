"""`python -m gateway` is `llms-gateway`."""

import sys

from gateway.cli import main

sys.exit(main())
