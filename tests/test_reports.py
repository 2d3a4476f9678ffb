"""Plots and the HTML report, on small result files made by the real commands."""

from __future__ import annotations

import base64
import csv
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from ddlsim.reports import plots
from ddlsim.reports.html_report import build_report
from ddlsim.simulator.cli.main import main
from ddlsim.simulator.cli.validate_command import VALIDATION_COLUMNS


def write_validation_fixture(directory: Path) -> None:
    """A small validation directory in the format of the calibrate/validate issue."""
    directory.mkdir(parents=True)
    rows = []
    for index, (measured, predicted, status) in enumerate(
        [(1e-4, 1.1e-4, "calibration"), (1e-3, 0.9e-3, "predicted"), (1e-2, 1.3e-2, "predicted")]
    ):
        rows.append(
            {
                "id": f"DEEPBENCH-{index:03d}",
                "kind": "collective",
                "metric": "time_s",
                "collective": "allreduce",
                "algorithm": "ring",
                "device": "knl_7250",
                "devices_per_node": 1,
                "nodes": 2,
                "message_bytes": 4e5,
                "measured": measured,
                "predicted": predicted,
                "error_pct": 100 * (predicted - measured) / measured,
                "ci_low": predicted * 0.9,
                "ci_high": predicted * 1.1,
                "in_ci": True,
                "status": status,
            }
        )
    rows.append(
        {
            "id": "TFBENCH-001",
            "kind": "training",
            "metric": "throughput_samples_per_s",
            "workload": "resnet50",
            "device": "p100_sxm2",
            "devices_per_node": 8,
            "nodes": 1,
            "per_device_batch": 64,
            "precision": "fp32",
            "measured": 1500.0,
            "predicted": 1450.0,
            "error_pct": -3.33,
            "status": "predicted",
        }
    )
    rows.append(
        {
            "id": "MLPERF-066",
            "kind": "training",
            "metric": "throughput_samples_per_s",
            "measured": 2000.0,
            "status": "cannot_model",
            "reason": "no bf16 peak for xeon_8380h",
        }
    )
    with (directory / "validation.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, VALIDATION_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    summary = {  # fractions, as validate writes them
        "n_predicted": 3,
        "n_cannot_model": 1,
        "median_ape": 0.10,
        "p90_ape": 0.27,
        "max_ape": 0.30,
        "ci_level": 0.9,
        "ci_coverage": 0.5,
        "tolerance": 0.25,
        "passed": True,
    }
    (directory / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("results")
    dirs = {
        "sim_a": base / "sim_a",
        "sim_b": base / "sim_b",
        "coll": base / "coll",
        "coll_hd": base / "coll_hd",
        "validation": base / "validation",
    }
    common = ["--nodes", "1,2", "--executor-pool", "serial"]
    assert main(["simulate", *common, "--out", str(dirs["sim_a"])]) == 0
    assert main(["simulate", *common, "--network", "eth_10g", "--out", str(dirs["sim_b"])]) == 0
    sizes = ["--message-bytes", "1KB:1MB:x8"]
    assert main(["collective", "--ranks", "4,8", *sizes, "--out", str(dirs["coll"])]) == 0
    assert (
        main(["collective", "--algorithm", "halving_doubling", "--ranks", "8", *sizes, "--out", str(dirs["coll_hd"])])
        == 0
    )
    write_validation_fixture(dirs["validation"])
    return dirs


def assert_png(path: Path, kind: str) -> None:
    data = path.read_bytes()
    assert plots.png_size(data) == plots.expected_png_size(kind)
    pixels = matplotlib.image.imread(path)
    assert pixels.std() > 0.05, "blank image"


@pytest.mark.parametrize(
    ("kind", "dirs", "figure"),
    [
        ("scaling", ["sim_a", "sim_b"], "scaling"),
        ("breakdown", ["sim_b"], "breakdown"),
        ("validate", ["validation"], "validate"),
        ("collective", ["coll", "coll_hd"], "collective"),
    ],
)
def test_each_plot_command_writes_a_png_of_the_expected_size(capsys, tmp_path, results, kind, dirs, figure):
    out = tmp_path / f"{kind}.png"
    assert main(["plot", kind, *(str(results[d]) for d in dirs), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert_png(out, figure)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # atomic: no temporary left


def test_runs_that_differ_only_in_their_collective_get_two_legend_labels(tmp_path, capsys):
    """plot scaling runs/ring runs/ps drew two curves under one label before."""
    from ddlsim.reports.plots import run_label

    common = ["--nodes", "1,2", "--executor", "analytic", "--no-progress"]
    assert main(["simulate", *common, "--out", str(tmp_path / "ring")]) == 0
    assert main(["simulate", *common, "--collective", "parameter_server", "--collective-option",
                 "placement=per_node", "--out", str(tmp_path / "ps")]) == 0  # fmt: skip
    capsys.readouterr()
    assert run_label(tmp_path / "ring") == "resnet50 / p100_sxm2 x8 / ib_edr / sync_sgd"
    assert run_label(tmp_path / "ps") == "resnet50 / p100_sxm2 x8 / ib_edr / sync_sgd (parameter_server)"


def test_plot_defaults_to_a_file_in_the_result_directory(tmp_path, results):
    run = tmp_path / "run"
    shutil.copytree(results["sim_a"], run)
    assert main(["plot", "breakdown", str(run)]) == 0
    assert_png(run / "breakdown.png", "breakdown")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plot", "scaling", "{missing}"], "no such directory"),
        (["plot", "scaling", "{coll}"], "needs a scaling one"),
        (["plot", "collective", "{sim_a}"], "needs a collective one"),
        (["plot", "validate", "{sim_a}"], "needs a validation one"),
        (["plot", "breakdown", "{empty}"], "not a result directory"),
        (["report", "{sim_a}", "{missing}", "--out", "{tmp}/r.html"], "no such directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, results, argv, message):
    (tmp_path / "empty").mkdir()
    names = {key: str(value) for key, value in results.items()}
    names |= {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty"), "tmp": str(tmp_path)}
    assert main([arg.format(**names) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddlsim: error:") and message in err
    assert not (tmp_path / "r.html").exists()


class PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.tables = 0
        self.headings: list[str] = []
        self.links: list[str] = []
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        values = {key: value or "" for key, value in attrs}
        if tag == "img":
            self.images.append(values)
        if tag == "table":
            self.tables += 1
        if tag in ("h1", "h2", "h3"):
            self._in_heading = True
            self.headings.append("")
        for key in ("href", "src"):
            if key in values and not values[key].startswith("data:"):
                self.links.append(values[key])

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3"):
            self._in_heading = False

    def handle_data(self, data):
        if self._in_heading:
            self.headings[-1] += data


def test_html_report_inlines_every_plot_and_the_tables(capsys, tmp_path, results):
    out = tmp_path / "report.html"
    dirs = [str(results[name]) for name in ("sim_a", "sim_b", "coll", "validation")]
    assert main(["report", *dirs, "--out", str(out)]) == 0
    parser = PageParser()
    parser.feed(out.read_text(encoding="utf-8"))
    assert parser.links == []  # self-contained: nothing fetched from elsewhere
    # scaling + 2 breakdowns + collective + validation
    assert len(parser.images) == 5
    for img in parser.images:
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix)
        png = base64.b64decode(img["src"][len(prefix) :])
        assert plots.png_size(png) == (int(img["width"]), int(img["height"]))
    assert {"Training scaling", "Collectives"} <= {h.strip() for h in parser.headings}
    assert any(h.startswith("Validation") for h in parser.headings)
    # sources, per sim run scenario + results (2 x 2), per collective run (1), validation summary,
    # largest errors and cannot-model rows
    assert parser.tables == 1 + 4 + 1 + 3


def test_report_is_deterministic(results):
    dirs = [results["sim_a"], results["coll"]]
    assert build_report(dirs) == build_report(dirs)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed")
def test_report_renders_in_headless_chromium(tmp_path, results):
    out = tmp_path / "report.html"
    assert main(["report", str(results["sim_a"]), str(results["sim_b"]), "--out", str(out)]) == 0
    shot = tmp_path / "shot.png"
    command = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,1400",
        f"--screenshot={shot}",
        out.as_uri(),
    ]
    subprocess.run(command, capture_output=True, timeout=90, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.std() > 0.05, "blank screenshot"
    # the plots' first series colour (#0072B2) is on screen: the inlined images rendered
    blue = np.array([0x00, 0x72, 0xB2]) / 255
    assert (np.abs(pixels - blue).max(axis=-1) < 0.04).sum() > 500


def test_gallery_writes_tables_plots_and_marks_failures_pending(tmp_path):
    from ddlsim.reports.gallery import Comparison, Entry, Run, build_gallery, efficiency_pct
    from ddlsim.reports.gallery_entries import ENTRIES
    from ddlsim.simulator.cli.gallery_runs import run_gallery

    tiny = Entry(
        "tiny",
        "A tiny scaling check",
        "nobody, 2024",
        (Run("ring", "simulate --nodes 1,2 --executor-pool serial"),),
        lambda results: [Comparison("efficiency at 2 nodes", 90.0, efficiency_pct(results["ring"], 2), "%")],
        "the default scenario",
        "none",
    )
    broken = Entry("broken", "Not there yet", "-", (Run("x", "no-such-command"),), lambda _: [], "-", "-", plot="none")
    written = run_gallery(tmp_path, [tiny, broken])
    assert written == ["README.md", "index.html", "tiny.png"]
    assert build_gallery(tmp_path, [tiny, broken]) == written  # the page again, from the result files alone
    readme = (tmp_path / "README.md").read_text()
    assert "| A tiny scaling check | efficiency at 2 nodes | 90.0% |" in readme
    assert "ddlsim simulate --nodes 1,2 --executor-pool serial --out runs/tiny/ring" in readme
    assert "**Pending.**" in readme and "no-such-command" in readme
    assert_png(tmp_path / "tiny.png", "scaling")
    assert sorted(p.name for p in (tmp_path / "runs" / "tiny" / "ring").iterdir()) == [
        "results.csv", "scenario.json", "stdout.txt",
    ]  # fmt: skip
    parser = PageParser()
    parser.feed((tmp_path / "index.html").read_text())
    assert parser.links == ["tiny.png"] and parser.tables == 2
    assert len({entry.key for entry in ENTRIES}) == len(ENTRIES)


def test_per_node_plot_puts_layouts_on_the_same_node_axis(results, tmp_path):
    """sim_a and sim_b (1 and 2 nodes of 8 GPUs): one PNG of the scaling figure's size, not blank."""
    png = plots.per_node_png([results["sim_a"], results["sim_b"]])
    assert plots.png_size(png) == plots.expected_png_size("scaling")
    out = tmp_path / "per_node.png"
    plots.save_png(png, out)
    assert_png(out, "scaling")


def test_gallery_entries_plot_runs_they_have():
    from ddlsim.reports.gallery_entries import ENTRIES

    for entry in ENTRIES:
        assert entry.plot in ("scaling", "per_node", "collective", "none"), entry.key
        names = {run.name for run in entry.runs}
        assert set(entry.extra.get("plot_runs", ())) <= names, entry.key


def test_knl_hybrid_entry_uses_the_split_best_split_finds(capsys):
    """The gallery's 1536-node hybrid sweep runs a fixed split (--best-split at 1536 nodes takes minutes);
    it must be the one --best-split finds at 16 nodes, or the entry is stale."""
    from ddlsim.reports.gallery_entries import ENTRIES, KNL_HYBRID_SPLIT

    entry = next(entry for entry in ENTRIES if entry.key == "codreanu2017_knl_hybrid")
    search = next(run for run in entry.runs if run.name == "hybrid_best_split")
    assert main(search.argv(Path("unused"), Path("unused"))) == 0
    assert f"# best split {KNL_HYBRID_SPLIT}:" in capsys.readouterr().out


@pytest.mark.slow
def test_gallery_rank_jitter_is_what_calibrate_fits_on_the_development_data():
    """The synchronous entries' --stragglers sigma is a calibrated number, not a knob: it must be the
    one ddlsim calibrate fits on the packaged published_dev.csv, or the gallery is stale."""
    from ddlsim.reports.gallery import RANK_JITTER_SIGMA
    from ddlsim.simulator.calibration.fit import calibrate
    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements

    fitted = calibrate(read_measurements([packaged_published_dev()]).rows, bootstrap=0).profile
    assert fitted.rank_jitter_sigma == pytest.approx(RANK_JITTER_SIGMA, abs=1e-9)


@pytest.mark.slow
def test_gallery_runs_a_calibration_its_other_runs_read_and_states_reasons(tmp_path):
    """A run may write one file (a calibrated profile) that later runs name as {entry}/FILE; the summary
    table gives the reason of a comparison more than 10% off, and leaves it out for one that is not."""
    from ddlsim.reports.gallery import Comparison, Entry, Run, throughput
    from ddlsim.simulator.cli.gallery_runs import run_gallery

    def compare(results):
        rate = throughput(results["sim"], 1)
        return [
            Comparison("rate, close", rate * 1.05, rate, "img/s", reason="not shown: within 10%"),
            Comparison("rate, far off", rate * 2, rate, "img/s", reason="because of the stated mechanism"),
        ]

    entry = Entry(
        "calibrated",
        "Calibrate, then simulate",
        "nobody",
        (
            Run("profile.toml", "calibrate --measurements {published_dev} --bootstrap 0", results=False),
            Run("sim", "simulate --nodes 1 --executor-pool serial --profile {entry}/profile.toml"),
        ),
        compare,
        "-",
        "-",
        plot="none",
    )
    run_gallery(tmp_path, [entry])
    assert (tmp_path / "runs" / "calibrated" / "profile.toml").is_file()
    readme = (tmp_path / "README.md").read_text()
    assert (
        "ddlsim calibrate --measurements published_dev.csv --bootstrap 0 --out runs/calibrated/profile.toml" in readme
    )
    assert "--profile runs/calibrated/profile.toml" in readme
    assert "| because of the stated mechanism |" in readme and "not shown" not in readme.split("\n## ")[0]
    stdout = (tmp_path / "runs" / "calibrated" / "sim" / "stdout.txt").read_text()
    assert "# profile " in stdout


def test_every_gallery_figure_more_than_10_percent_off_states_why():
    """The committed gallery (reports/gallery/README.md): in its summary table every row off by more than
    10% (10 points) carries a reason, and every entry has at least one row."""
    readme = (Path(__file__).parent.parent / "reports" / "gallery" / "README.md").read_text(encoding="utf-8")
    summary = readme.split("\n## ")[0]
    rows = [line.split(" | ") for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    off = 0
    for cells in rows:
        gap, why = cells[4].strip(), cells[5].strip(" |")
        if gap.endswith("points"):
            too_far = abs(float(gap.split()[0])) > 10
        elif "x)" in gap:
            too_far = abs(float(gap.split("(")[1].rstrip("x)")) - 1) > 0.10
        else:
            too_far = False
        if too_far:
            off += 1
            assert why, cells
    assert off > 0 and len(rows) > 40
