"""A validation never predicts a row with a catalog value derived from that row (calibration/unseen.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddlsim.hardware_models.catalog import (
    CatalogError,
    catalog_files,
    forget_catalog_directories,
    load_device,
    register_catalog_directory,
)
from ddlsim.hardware_models.profile import Profile
from ddlsim.simulator.calibration.crossval import leave_one_source_out
from ddlsim.simulator.calibration.intervals import Estimator
from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements
from ddlsim.simulator.calibration.unseen import unseen_devices, without


@pytest.fixture
def clean_search_path(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("DDLSIM_CATALOG", raising=False)
    forget_catalog_directories()
    yield
    forget_catalog_directories()


def skylake_copy(root: Path, token: str, efficiency: float, derived: bool = True) -> Path:
    """A user catalog holding ``token``: xeon_8180's datasheet with another compute efficiency,
    derived (or not) from row ``T-1``."""
    text = catalog_files("devices")["xeon_8180"].read_text()
    text = text.replace("value = 0.40", f"value = {efficiency}")
    marker = 'derived_from = ["MLPERF-012"]'
    assert marker in text
    text = text.replace(marker, 'derived_from = ["T-1"]' if derived else "")
    (root / "devices").mkdir(parents=True, exist_ok=True)
    (root / "devices" / f"{token}.toml").write_text(text)
    return root


def published(*ids: str):
    rows = {row.id: row for row in read_measurements([packaged_published_dev()]).rows}
    return [rows[i] for i in ids]


def test_a_value_goes_only_when_every_row_it_was_derived_from_is_predicted() -> None:
    one = unseen_devices({"MLPERF-012"})
    assert set(one) == {"xeon_8180", "xeon_6148", "xeon_8160"}  # all three rest on MLPERF-012 alone
    assert one["xeon_8180"].compute_efficiency == load_device("xeon_8380h").compute_efficiency  # nearest generation
    assert "MLPERF-012" in one["xeon_8180"].sources["compute_efficiency"]
    # the V100s' 0.35 rests on any of five MLPerf rows: predicting one of them leaves it standing
    assert unseen_devices({"MLPERF-027"}) == {}
    assert "v100_sxm3" in unseen_devices({"MLPERF-027", "MLPERF-042", "MLPERF-044", "MLPERF-054", "MLPERF-060"})


def test_another_published_bound_replaces_a_value_before_the_generation_does() -> None:
    fits = unseen_devices({"LLM-030"})
    assert fits["a100_sxm4_80gb"].compute_efficiency == pytest.approx(0.479)  # Narayanan et al.'s LLM-005
    assert fits["a100_sxm4"].layer_efficiency == {"transformer": pytest.approx(0.479)}
    assert fits["a100_sxm4"].compute_efficiency is None  # its ResNet figure rests on MLPerf rows, not LLM-030
    both = unseen_devices({"LLM-030", "LLM-005"})
    assert both["a100_sxm4_80gb"].compute_efficiency == load_device("a100_sxm4").compute_efficiency


def test_a_fitted_efficiency_in_the_profile_is_kept() -> None:
    from ddlsim.hardware_models.profile import DeviceFit

    profile = Profile(devices={"xeon_8180": DeviceFit(compute_efficiency=0.5)})
    assert without(profile, {"MLPERF-012"}).devices["xeon_8180"].compute_efficiency == 0.5
    assert without(Profile(), {"MLPERF-012"}).devices["xeon_8180"].compute_efficiency != 0.5
    assert without(Profile(), {"TFBENCH-001"}) == Profile()


def test_a_prediction_does_not_move_with_a_value_derived_from_its_own_row(tmp_path: Path, clean_search_path) -> None:
    devices = (("high", 0.8, True), ("low", 0.2, True), ("undeclared", 0.8, False))
    for name, efficiency, derived in devices:
        skylake_copy(tmp_path, f"skl_{name}", efficiency, derived)
    register_catalog_directory(tmp_path)
    values = {}
    for name, _, _ in devices:
        row = dataclasses.replace(published("MLPERF-012")[0], id="T-1", device=f"skl_{name}")
        blind = Estimator(without(Profile(), {"T-1"}), intervals=False).predict(row).value
        plain = Estimator(Profile(), intervals=False).predict(row).value
        values[name] = (blind, plain)
    assert values["high"][0] == pytest.approx(values["low"][0], rel=1e-12)  # the catalog's 0.8 or 0.2 never enters
    assert values["high"][1] > 1.5 * values["low"][1]  # it does where the validation does not predict T-1
    assert values["undeclared"][0] == pytest.approx(values["undeclared"][1])  # nothing declared, nothing replaced
    assert values["undeclared"][0] > 1.3 * values["high"][0]


@pytest.mark.slow
def test_leave_one_source_out_fits_and_predicts_a_fold_without_values_its_rows_gave(
    tmp_path: Path, clean_search_path
) -> None:
    """The fold's compute fit and its prediction both start from the replaced value: the held-out
    row's prediction is the same whatever the catalog derived from it."""
    base = published("MLPERF-012")[0]
    predicted = {}
    skylake_copy(tmp_path, "skl_high", 0.8)
    skylake_copy(tmp_path, "skl_low", 0.2)
    register_catalog_directory(tmp_path)
    for name in ("high", "low"):
        token = f"skl_{name}"
        row = dataclasses.replace(base, id="T-1", device=token, source="mine")
        # a row of the same device from another source: the fold fits its factor against the base it starts from
        theirs = dataclasses.replace(base, id="T-2", device=token, source="theirs", per_device_batch=32, value=80.0)
        others = [*published("TFBENCH-001", "TFBENCH-002", "TFBENCH-003", "TFBENCH-005"), theirs]
        table = leave_one_source_out([*others, row], 0.9, bootstrap=0)
        entry = next(entry for entry in table if entry["id"] == "T-1")
        assert entry["status"] == "predicted", entry["reason"]
        catalog_value = 0.8 if name == "high" else 0.2
        assert f"{token}: compute efficiency 0.4, not the catalog's {catalog_value}, derived from T-1" in entry["note"]
        predicted[name] = entry["predicted"]
    assert predicted["high"] == pytest.approx(predicted["low"], rel=1e-9)


def test_derived_from_must_name_rows(tmp_path: Path, clean_search_path) -> None:
    root = skylake_copy(tmp_path / "bad", "skl_bad", 0.4)
    path = root / "devices" / "skl_bad.toml"
    path.write_text(path.read_text().replace('derived_from = ["T-1"]', "derived_from = []"))
    register_catalog_directory(root)
    with pytest.raises(CatalogError, match="derived_from and rows must be non-empty lists of row ids"):
        load_device("skl_bad")
    alternative = 'alternatives = [{ value = 0.5, rows = ["X"], source = "s" }]'
    path.write_text(path.read_text().replace("derived_from = []", alternative))
    forget_catalog_directories()
    register_catalog_directory(root)
    with pytest.raises(CatalogError, match="alternatives need derived_from"):
        load_device("skl_bad")
