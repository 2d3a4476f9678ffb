"""ddlsim: predict and measure distributed deep-learning training.

The one import name of the project. Its parts live in the top-level folders of the repository
(the layout of docs/architecture.md) and are linked here, so an install adds this single module:

    ddlsim.hardware_models   datasheets and pure cost functions (compute, network, memory)
    ddlsim.algorithms        collective schedules and training role programs (backend-neutral)
    ddlsim.simulator         the executors (event engine, closed form), calibration, the CLI
    ddlsim.real_runs         the same role programs on MPI/gloo ranks with torch
    ddlsim.reports           plots and reports, reading result files only
    ddlsim.registry          the extension-point registries every part uses (this folder's own module)
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ddlsim")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"
