"""``python -m ddlsim`` runs the command line."""

import sys

from ddlsim.simulator.cli import main

sys.exit(main())
