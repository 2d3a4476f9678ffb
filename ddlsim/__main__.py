"""``python -m ddlsim`` runs the command line."""

import sys

from ddlsim.simulator.cli.main import main

sys.exit(main())
