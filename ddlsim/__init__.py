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

from typing import Any


def __getattr__(name: str) -> Any:
    # the version is looked up only when asked for: importlib.metadata costs tens of milliseconds at
    # every start of the command line otherwise
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("ddlsim")
        except PackageNotFoundError:  # running from a checkout that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'ddlsim' has no attribute {name!r}")
