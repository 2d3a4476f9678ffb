"""The layout reads as the architecture (docs/architecture.md): no import runs from a lower layer up.

Every ``ddlsim.*`` import of every module (function-level ones included) is checked against the
parts each part may use. A new module is checked without touching this file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("hardware_models", "algorithms", "simulator", "real_runs", "reports")

# part (a dotted prefix) -> the prefixes it may import; the longest matching prefix of a module rules.
# ``registry`` (ddlsim/registry.py: the extension-point registries and their unknown-name error) is
# below every part.
ALLOWED = {
    "hardware_models": ("hardware_models",),
    "algorithms": ("algorithms", "hardware_models"),
    "simulator": ("simulator", "algorithms", "hardware_models"),
    "simulator.engine": ("simulator.engine", "algorithms", "hardware_models"),
    "simulator.training": (
        "simulator.training",
        "simulator.records",
        "simulator.scenario",
        "simulator.workloads",
        "simulator.engine",
        "algorithms",
        "hardware_models",
    ),
    "simulator.cli": ("simulator", "algorithms", "hardware_models", "real_runs", "reports"),
    # simulator.progress, like records, imports nothing of ddlsim: the benchmarks report progress with it
    "real_runs": ("real_runs", "algorithms", "hardware_models", "simulator.records", "simulator.progress"),
    "reports": ("reports", "simulator.records"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddlsim."):
            found.add(node.module.removeprefix("ddlsim."))
        elif isinstance(node, ast.Import):
            found |= {alias.name.removeprefix("ddlsim.") for alias in node.names if alias.name.startswith("ddlsim.")}
    return found


def rule_for(module: str) -> tuple[str, ...]:
    prefix = max((key for key in ALLOWED if module == key or module.startswith(key + ".")), key=len)
    return (*ALLOWED[prefix], "registry")


MODULES = sorted(path for part in PARTS for path in (ROOT / part).rglob("*.py"))


def test_the_registry_imports_nothing_of_ours():
    assert imports_of(ROOT / "ddlsim" / "registry.py") == set()


@pytest.mark.parametrize("path", MODULES, ids=[module_name(path) for path in MODULES])
def test_imports_follow_the_layers(path):
    module = module_name(path)
    allowed = rule_for(module)
    bad = sorted(
        target for target in imports_of(path) if not any(target == a or target.startswith(a + ".") for a in allowed)
    )
    assert not bad, f"{module} imports {bad}; {module.split('.')[0]} may import only {allowed}"


def test_nothing_below_the_command_line_imports_it():
    users = {module_name(path) for path in MODULES if any(t.startswith("simulator.cli") for t in imports_of(path))}
    assert {user for user in users if not user.startswith("simulator.cli")} == set()
