"""``python -m ddlsim`` runs the command line.

Guarded, because ``python -m mpi4py.futures -m ddlsim ...`` (``--executor-pool mpi``) imports this module
again in every worker rank, under another name: unguarded, each worker would run the command itself.
"""

import sys

from ddlsim.simulator.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
