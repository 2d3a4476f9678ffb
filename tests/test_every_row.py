"""Issue 13 item 1 and issue 15 items 7 and 9: every row gets an answer, whatever the file looks like."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import tomllib

import pytest

from ddlsim.hardware_models.profile import parse_profile
from ddlsim.simulator.calibration.intervals import Estimator
from ddlsim.simulator.calibration.measurements import MEASUREMENT_COLUMNS, Measurement, read_measurements
from ddlsim.simulator.calibration.predict import predict
from ddlsim.simulator.cli.main import main
from ddlsim.simulator.records import read_csv
from tests.test_measurements import GOOD, write_rows

TRAINING = {
    **GOOD, "id": "TR-1", "kind": "training", "collective": "", "workload": "resnet50", "algorithm": "nccl",
    "device": "p100_sxm2", "devices_per_node": "8", "nodes": "1", "intra_node_link": "nvlink1", "network": "",
    "message_bytes": "", "per_device_batch": "64", "metric": "throughput_samples_per_s", "value": "1800",
}  # fmt: skip


def test_a_bad_row_is_listed_and_the_others_are_predicted(tmp_path, capsys):
    """An unknown workload token (a model the catalog lacks) no longer refuses the file."""
    path = write_rows(
        tmp_path / "mixed.csv",
        [GOOD, {**GOOD, "id": "T-2", "message_bytes": "4000000"}, {**TRAINING, "workload": "maskrcnn"}],
    )
    out = tmp_path / "report"
    code = main(["validate", "--measurements", str(path), "--out", str(out), "--tolerance", "10"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    table = {row["id"]: row for row in read_csv(out / "validation.csv")}
    assert table["T-1"]["status"] == "predicted" and table["T-2"]["status"] == "predicted"
    assert table["TR-1"]["status"] == "cannot_model" and "unknown token 'maskrcnn'" in table["TR-1"]["reason"]
    assert "cannot model TR-1" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_predicted"] == 2 and summary["n_cannot_model"] == 1
    assert summary["predicted_fraction"] == pytest.approx(2 / 3)


def test_spreadsheet_exports_read_with_a_notice(tmp_path):
    """A UTF-8 byte-order mark, Windows-1252 bytes, empty trailing cells and blank lines all read;
    a row with non-empty extra cells is set aside with its reason."""
    header = ",".join(MEASUREMENT_COLUMNS)
    good = ",".join(GOOD[column] for column in MEASUREMENT_COLUMNS)
    notes = good.replace(",direct,", ",direct,") + " caf\xe9"  # Latin-1 e-acute in the notes
    (tmp_path / "bom.csv").write_bytes(("\ufeff" + header + "\n" + good + ",,\n\n").encode("utf-8"))
    (tmp_path / "latin1.csv").write_bytes((header + "\n" + notes.replace("T-1", "L-1") + "\n").encode("cp1252"))
    extra = good.replace("T-1", "X-1") + ",surplus"
    (tmp_path / "extra.csv").write_text(header + "\n" + good.replace("T-1", "X-2") + "\n" + extra + "\n")
    result = read_measurements([tmp_path / "bom.csv", tmp_path / "latin1.csv", tmp_path / "extra.csv"])
    assert [row.id for row in result.rows] == ["T-1", "L-1", "X-2"]
    assert result.rows[1].notes.endswith("café")
    assert any("not UTF-8" in notice and "latin1.csv" in notice for notice in result.notices)
    [rejected] = result.rejected
    assert rejected.id == "X-1" and "beyond the header" in rejected.reason and "'surplus'" in rejected.reason


def test_colliding_ids_are_renamed_and_reported(tmp_path):
    first = write_rows(tmp_path / "run_a.csv", [GOOD])
    second = write_rows(tmp_path / "run_b.csv", [{**GOOD, "value": "0.002"}])
    result = read_measurements([first, second])
    assert [row.id for row in result.rows] == ["T-1", "T-1#2"]
    assert any("used more than once" in notice and "'T-1'" in notice for notice in result.notices)


def test_validating_one_run_against_another_with_the_same_ids_predicts_it(tmp_path, capsys):
    """Two bench runs reuse ids: the second run's rows are held-out rows, not 'calibration' rows."""
    sizes = ("1000", "10000", "100000", "1000000", "10000000")
    run_a = [{**GOOD, "id": f"B-{s}", "message_bytes": s, "value": str(1e-5 + int(s) / 1e10)} for s in sizes]
    run_b = [{**row, "value": str(float(row["value"]) * 1.05)} for row in run_a]
    a, b = write_rows(tmp_path / "a.csv", run_a), write_rows(tmp_path / "b.csv", run_b)
    main(["validate", "--measurements", str(b), "--calibration", str(a), "--out", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert "name different rows in --calibration" in captured.err
    statuses = {row["status"] for row in read_csv(tmp_path / "r" / "validation.csv")}
    assert statuses == {"predicted"}


@pytest.mark.parametrize(
    ("change", "column", "expected"),
    [
        ({"value": "1e308"}, "value", "must be in"),
        ({"message_bytes": "0.5"}, "message_bytes", "whole number"),
        ({"nodes": "1e308"}, "nodes", "must be in"),
        ({"metric": "bus_bandwidth_Bps", "value": "1e-300"}, "value", "must be in"),
    ],
)
def test_absurd_numbers_are_set_aside(tmp_path, change, column, expected):
    result = read_measurements([write_rows(tmp_path / "m.csv", [GOOD, {**GOOD, "id": "T-2", **change}])])
    [rejected] = result.rejected
    assert rejected.id == "T-2" and f"column {column!r}" in rejected.reason and expected in rejected.reason


def _measurement(**fields) -> Measurement:
    row = Measurement(
        id="TR-1", kind="training", metric="throughput_samples_per_s", value=1800.0, device="p100_sxm2",
        devices_per_node=8, nodes=1, workload="resnet50", algorithm="nccl", intra_node_link="nvlink1",
        per_device_batch=64, precision="fp32",
    )  # fmt: skip
    return dataclasses.replace(row, **fields)


def test_open_fields_take_the_default_and_widen_the_interval():
    """'Pascal GPUs' with no device, library, batch or precision: predicted as a P100 PCIe with NCCL,
    batch 64, fp32; the interval covers the alternatives and the note says what was assumed."""
    from ddlsim.hardware_models.profile import Profile

    estimator = Estimator(Profile(noise_sigma=0.05), ci=0.9)
    stated = estimator.estimate(_measurement(device="p100_pcie", intra_node_link="pcie3_x16"))
    row = _measurement(
        device="", algorithm="", per_device_batch=None, precision="", intra_node_link="", notes="8 Pascal GPUs"
    )
    estimate = estimator.estimate(row)
    assert estimate.value == pytest.approx(stated.value)
    for text in ("device not stated: p100_pcie", "library not stated: nccl", "batch not stated: 64", "pcie3_x16"):
        assert text in estimate.note
    assert estimate.width > stated.width
    for alternative in ({"device": "titanx_pascal"}, {"per_device_batch": 128}, {"intra_node_link": "nvlink1"}):
        resolved = _measurement(**{"device": "p100_pcie", "intra_node_link": "pcie3_x16", **alternative})
        value = predict(resolved, Profile()).value
        assert estimate.low <= value <= estimate.high
    assert Estimator(Profile()).estimate(_measurement(device="", notes="some GPUs")).value is None


def test_a_multi_node_row_without_its_network_gets_the_eras_default():
    from ddlsim.hardware_models.profile import Profile

    row = _measurement(nodes=4, network="")
    estimate = Estimator(Profile(noise_sigma=0.05)).estimate(row)
    assert estimate.value is not None and "network not stated: ib_edr assumed" in estimate.note
    # Pascal clusters also ran 25 Gb/s Ethernet (Goyal et al., Horovod): AlexNet on 4 nodes runs at a
    # third of its EDR rate there, far beyond the noise band, and the interval holds that prediction too
    alexnet = _measurement(nodes=4, network="", workload="alexnet")
    estimate = Estimator(Profile(noise_sigma=0.05)).estimate(alexnet)
    assert "interval spans ib_fdr, eth_25g" in estimate.note
    ethernet = predict(dataclasses.replace(alexnet, network="eth_25g"), Profile()).value
    assert ethernet < estimate.value * math.exp(-2 * 0.05)
    assert estimate.low <= ethernet <= estimate.high


def test_a_multi_node_row_on_its_vendor_system_without_its_adapters_gets_the_system_s():
    """8 P100 SXM2 on NVLink 1 a node is the DGX-1 of the device's datasheet: without adapters stated, a
    4-node row takes its 4 EDR adapters (NCCL rings over each), the interval reaching one adapter a node;
    a stated count, or another node shape, opens nothing."""
    from ddlsim.hardware_models.profile import Profile

    row = _measurement(nodes=4, network="ib_edr", workload="alexnet")
    estimate = Estimator(Profile(noise_sigma=0.05)).estimate(row)
    assert "network adapters per node not stated: 4 assumed" in estimate.note
    four, one = (predict(dataclasses.replace(row, nics_per_node=n), Profile()).value for n in (4, 1))
    assert estimate.value == pytest.approx(four) and one < four
    assert estimate.low <= one <= estimate.high
    stated = Estimator(Profile(noise_sigma=0.05)).estimate(dataclasses.replace(row, nics_per_node=1))
    assert "adapters" not in stated.note and stated.value == pytest.approx(one)
    other = Estimator(Profile(noise_sigma=0.05)).estimate(dataclasses.replace(row, devices_per_node=4))
    assert "adapters" not in other.note


def test_estimates_are_computed_once_per_configuration():
    from ddlsim.hardware_models.profile import Profile

    estimator = Estimator(Profile(noise_sigma=0.05), intervals=False)
    rows = [_measurement(id=f"R-{i}", value=1000.0 + i) for i in range(50)]
    values = {estimator.estimate(row).value for row in rows}
    assert len(values) == 1
    assert sum(1 for key in estimator._cache if key[0] == "estimate") == 1


def test_calibrate_warns_on_an_implausible_fit_and_writes_a_profile_that_loads(tmp_path, capsys):
    """Rows scattered by a factor of 4 (a unit slip): a warning names the sigma; the profile loads."""
    sizes = ("1000", "10000", "100000", "1000000", "10000000", "100000000")
    rows = []
    for index, size in enumerate(sizes * 2):
        factor = 4.0 if index % 2 else 0.25
        rows.append(
            {**GOOD, "id": f"S-{index}", "message_bytes": size, "value": str((2e-6 + int(size) / 1e10) * factor)}
        )
    path = write_rows(tmp_path / "scatter.csv", rows)
    profile = tmp_path / "p.toml"
    code = main(["calibrate", "--measurements", str(path), "--out", str(profile), "--bootstrap", "3"])
    captured = capsys.readouterr()
    assert code == 0
    assert "ddlsim: warning: noise sigma" in captured.err and "factor" in captured.err
    parse_profile(tomllib.loads(profile.read_text()), profile)  # what was written loads
    header = captured.out.splitlines()[1].split()
    assert header == ["id", "group", "metric", "measured", "fitted", "unit", "error_pct"]
    assert "time_s" in captured.out and " s " in captured.out


def test_calibrate_refuses_a_directory_as_out_before_fitting(tmp_path, capsys):
    path = write_rows(tmp_path / "m.csv", [GOOD])
    assert main(["calibrate", "--measurements", str(path), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_validate_writes_strict_json(tmp_path):
    path = write_rows(tmp_path / "m.csv", [{**TRAINING, "workload": "maskrcnn"}, GOOD])
    main(["validate", "--measurements", str(path), "--out", str(tmp_path / "r"), "--tolerance", "10"])
    text = (tmp_path / "r" / "summary.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in summary.json"))
    with (tmp_path / "r" / "validation.csv").open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 2


def test_a_row_beyond_the_calibrated_scale_widens_by_the_modelled_change_from_it():
    """Calibrated up to 2 nodes of 8 (16 P100s, nccl, EDR), predicted at 8 nodes: the modelled change
    of the per-device rate from 16 to 64 devices becomes the interval's half-width (in quadrature
    with the kind's sigma), and the note says so; at 16 devices, or for another algorithm, no change."""
    import math

    from ddlsim.hardware_models.profile import Profile

    sigma = 0.05
    profile = Profile(noise_sigma=sigma, rank_jitter_sigma=0.065, calibrated_scale={"training/p100_sxm2/nccl": 16.0})
    estimator = Estimator(profile, ci=0.9)
    far = _measurement(nodes=8, network="ib_edr", nics_per_node=4)  # stated: no open field to resolve
    estimate = estimator.estimate(far)
    # the change, worked out from two plain predictions: the per-device rate at 64 and at 16 devices
    at_64 = predict(far, profile).value
    at_16 = predict(dataclasses.replace(far, nodes=2), profile).value
    change = abs(math.log((at_64 / 64) / (at_16 / 16)))
    assert change > 0.01  # the slowest of 64 ranks waits longer than the slowest of 16
    z = 1.6448536269514722
    assert estimate.value == pytest.approx(at_64)
    assert math.log(estimate.high / estimate.value) == pytest.approx(z * math.hypot(sigma, change / z))
    assert "64 devices, beyond the 16 of the calibration rows" in estimate.note
    assert Estimator(profile).estimate(dataclasses.replace(far, nodes=2)).width == pytest.approx(
        math.exp(2 * z * sigma)
    )
    other = Estimator(profile).estimate(dataclasses.replace(far, algorithm="ring"))
    assert other.width == pytest.approx(math.exp(2 * z * sigma)) and "beyond" not in other.note


def test_calibration_records_its_largest_scale_and_the_profile_keeps_it(tmp_path):
    """The calibrated scale per kind/device/algorithm is the largest device count of its rows, and it
    survives the profile's TOML (a bad entry is refused with the key named)."""
    from ddlsim.hardware_models.profile import Profile, ProfileError, profile_to_toml
    from ddlsim.simulator.calibration.fit import calibrated_scale

    rows = [_measurement(id="A", nodes=1), _measurement(id="B", nodes=4, network="ib_edr"),
            _measurement(id="C", devices_per_node=2, algorithm="ring")]  # fmt: skip
    scale, sources = calibrated_scale(rows)
    assert scale == {"training/p100_sxm2/nccl": 32.0, "training/p100_sxm2/ring": 2.0}
    assert "among the 2 calibration rows" in sources["calibrated_scale.training/p100_sxm2/nccl"]
    profile = Profile(calibrated_scale=scale, sources=sources)
    back = parse_profile(tomllib.loads(profile_to_toml(profile)), tmp_path / "p.toml")
    assert back.calibrated_scale == scale
    key = "calibrated_scale.training/p100_sxm2/ring"
    assert back.sources[key] == sources[key]
    text = profile_to_toml(profile).replace("value = 2.0", "value = 0.0")
    with pytest.raises(ProfileError, match=r"\[calibrated_scale\].*training/p100_sxm2/ring"):
        parse_profile(tomllib.loads(text), tmp_path / "q.toml")
