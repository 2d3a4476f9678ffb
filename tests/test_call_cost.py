"""A library's fixed cost per collective call (``LinkFit.call_s``): fitted apart from the per-step
alpha where rows at two scales tell them apart, taken as per call where one scale cannot, and paid
once per call by every executor."""

from __future__ import annotations

import dataclasses

import pytest

from ddlsim.hardware_models.profile import LinkFit, Profile, ProfileError, load_profile, profile_to_toml
from ddlsim.simulator.calibration.fit import calibrate
from ddlsim.simulator.calibration.measurements import Measurement
from ddlsim.simulator.calibration.predict import predict
from ddlsim.simulator.collective_sim import CollectiveSetup, simulate_collective
from tests.test_calibration import KEY, synthetic_collectives


def rows_under(truth: Profile, ranks: tuple[int, ...], sigma: float = 0.0) -> list[Measurement]:
    """Ring all-reduce times over eth_10g of the model under ``truth`` (one rank per node), with noise."""
    return synthetic_collectives(truth, sigma, seed=2, ranks=ranks)


def test_two_scales_tell_a_per_call_cost_from_a_per_step_alpha():
    """Rows at 2, 4 and 8 nodes made with a 2 ms cost per call (alpha the datasheet's): the per-call
    reading fits them and comes back; a per-step alpha would have to grow from 2 to 14 steps."""
    datasheet = LinkFit((), (35e-6,), (0.9e9,))
    truth = Profile(links={KEY: dataclasses.replace(datasheet, call_s=(2e-3,))})
    fit = calibrate(rows_under(truth, (2, 4, 8), sigma=0.01), bootstrap=0).profile.links[KEY]
    small = fit.segment(1e3)
    assert fit.call_s and fit.call_s[small] == pytest.approx(2e-3, rel=0.1)
    assert fit.alpha_s[small] == pytest.approx(35e-6, rel=1e-3)  # eth_10g: 10 us overhead + 25 us latency


def test_a_per_step_alpha_gets_no_per_call_cost_from_noise():
    truth = Profile(links={KEY: LinkFit((), (40e-6,), (0.9e9,))})
    profile = calibrate(rows_under(truth, (2, 4, 8), sigma=0.02), bootstrap=0).profile
    fit = profile.links[KEY]
    assert fit.alpha_s[fit.segment(1e3)] == pytest.approx(40e-6, rel=0.15)
    assert not fit.call_s or fit.call_s[fit.segment(1e3)] < 0.1 * 2 * 40e-6
    assert profile.per_step_reading() is None  # three scales decided every segment


def test_one_scale_keeps_the_datasheet_alpha_and_extrapolates_the_excess_flat():
    """Rows at 2 nodes only, 5 ms slower than the datasheet at every size: per step or per call is
    not decidable, the fit puts it per call, and 16 nodes then cost 5 ms more than the datasheet
    says (a per-step reading would add 15 x 5 / 2 ms)."""
    rows = [dataclasses.replace(row, value=row.value + 5e-3) for row in rows_under(Profile(), (2,))]
    profile = calibrate(rows, bootstrap=0).profile
    fit = profile.links[KEY]
    assert fit.call_s and all(c == pytest.approx(5e-3, rel=0.05) for c in fit.call_s)
    datasheet_alpha = 10e-6 + 25e-6  # eth_10g: per-message overhead + latency
    assert all(a == pytest.approx(datasheet_alpha, rel=1e-3) for a in fit.alpha_s)
    far = dataclasses.replace(rows[0], nodes=16)
    added = predict(far, profile).value - predict(far, Profile()).value
    assert added == pytest.approx(5e-3, rel=0.05)
    # the validation table names the term where it applied, as it does the rank jitter
    from ddlsim.simulator.calibration.crossval import table_row
    from ddlsim.simulator.calibration.intervals import Estimator

    note = table_row(far, Estimator(profile, 0.9).estimate(far), "predicted")["note"]
    assert "fitted fixed cost per call 5" in note
    # the per-step reading fitted as well: kept, and the interval at 16 nodes spans its prediction,
    # 15 x 2 steps of the excess spread over 2 steps (about 5 ms x 15 more), not just the kept one's
    assert fit.step_alpha_s and all(step > 1e-3 for step in fit.step_alpha_s)
    per_step = profile.per_step_reading()
    assert per_step is not None and not any(per_step.links[KEY].call_s)
    step_value = predict(far, per_step).value
    assert step_value > predict(far, profile).value + 50e-3
    estimate = Estimator(profile, 0.9).estimate(far)
    assert estimate.low <= predict(far, profile).value and estimate.high >= step_value
    assert "spans the per-step reading" in estimate.note
    at_two = Estimator(profile, 0.9).estimate(rows[0])  # at the scale measured, both readings agree
    assert "per-step reading" not in at_two.note
    # --ideal switches it off with the other step-level terms; the link's alpha and beta stay fitted
    assert predict(far, profile.ideal()).value == pytest.approx(predict(far, profile).value - added)
    assert profile.ideal().links[KEY].beta_Bps == fit.beta_Bps


def test_every_executor_pays_the_cost_once_per_call():
    profile = Profile(links={"ib_edr@v100_sxm2@nccl": LinkFit((), (2e-6,), (12e9,), call_s=(3e-3,))})
    setup = CollectiveSetup(
        devices_per_node=8, intra_node="nvlink2", network="ib_edr", profile=profile, device="v100_sxm2@nccl"
    )
    plain = dataclasses.replace(setup, profile=Profile(links={"ib_edr@v100_sxm2@nccl": LinkFit((), (2e-6,), (12e9,))}))
    for ranks, extra in ((16, 3e-3), (8, 0.0)):  # two nodes cross the network; one node does not
        with_cost = simulate_collective(setup, "nccl", "allreduce", ranks, 64e6)
        without = simulate_collective(plain, "nccl", "allreduce", ranks, 64e6)
        assert with_cost["time_s"] - without["time_s"] == pytest.approx(extra, abs=1e-9)
        assert with_cost["closed_form_s"] - without["closed_form_s"] == pytest.approx(extra, abs=1e-9)
        assert with_cost["call_s"] == extra and with_cost["launch_s"] == without["launch_s"]  # named apart


def test_the_cost_round_trips_through_the_profile_file_and_is_checked(tmp_path):
    profile = Profile(links={KEY: LinkFit((1e6,), (1e-5, 2e-5), (1e9, 1.2e9), "test", call_s=(0.0, 0.018))})
    path = tmp_path / "p.toml"
    path.write_text(profile_to_toml(profile))
    loaded = load_profile(path)
    assert loaded.links[KEY].call_s == (0.0, 0.018)
    assert loaded.flat()[f"links.{KEY}.call_s.1"] == pytest.approx(0.018)
    assert loaded.with_flat({f"links.{KEY}.call_s.1": 0.02}).links[KEY].call_s == (0.0, 0.02)
    path.write_text(profile_to_toml(profile).replace("call_s = { value = [0.0, 0.018]", "call_s = { value = [0.018]"))
    with pytest.raises(ProfileError, match="call_s needs one value per segment"):
        load_profile(path)
    undecided = Profile(links={KEY: dataclasses.replace(profile.links[KEY], step_alpha_s=(0.0, 2e-3))})
    path.write_text(profile_to_toml(undecided))
    assert load_profile(path).links[KEY].step_alpha_s == (0.0, 2e-3)
    text = profile_to_toml(undecided)
    path.write_text(text.replace("step_alpha_s = { value = [0.0, 0.002]", "step_alpha_s = { value = [0.002]"))
    with pytest.raises(ProfileError, match="step_alpha_s needs one value per segment"):
        load_profile(path)


class _Payload:
    def __init__(self, nbytes: float) -> None:
        self.nbytes = nbytes


def _spec(call_s: float):
    import dataclasses as dc

    from ddlsim.hardware_models.catalog import load_link
    from ddlsim.simulator.engine.fabric import FabricSpec

    pcie = load_link("pcie3_x16")
    network = dc.replace(load_link("ib_edr"), call_overhead_s=call_s)
    return FabricSpec(nodes=2, devices_per_node=4, peer_link=pcie, host_link=pcie, network=network)


@pytest.mark.parametrize("mode", ["vectorised", "message"])
def test_the_event_simulation_and_the_closed_form_pay_it_once_per_call(mode):
    """Two all-reduces, one over all 8 ranks of 2 nodes, one over the 4 of node 0: the first pays
    the network's 2 ms per call, the second (inside a node) does not."""
    from ddlsim.simulator.engine.fabric import Fabric
    from ddlsim.simulator.executor.role_executor import RoleExecutor
    from ddlsim.simulator.training.costs import GroupCosts

    def finish(call_s: float) -> list[float]:
        ends: list[float] = []

        def program(comm):
            yield comm.allreduce(_Payload(16e6), "ring")
            if comm.rank < 4:
                yield comm.allreduce(_Payload(16e6), "ring", group=(0, 1, 2, 3))
            ends.append(comm.now())

        RoleExecutor(Fabric(_spec(call_s)), list(range(8)), mode).run(program)
        return ends

    assert finish(2e-3) == pytest.approx([end + 2e-3 for end in finish(0.0)], rel=1e-12, abs=1e-12)
    plain, costly = GroupCosts(_spec(0.0)), GroupCosts(_spec(2e-3))
    assert costly.collective_s("allreduce", "ring", 8, 16e6, {}) == pytest.approx(
        plain.collective_s("allreduce", "ring", 8, 16e6, {}) + 2e-3
    )
    within = ("allreduce", "ring", 4, 16e6, {}, (0, 1, 2, 3))
    assert costly.collective_s(*within) == plain.collective_s(*within)


def test_calibrate_prints_each_link_segment_and_its_per_call_cost():
    from ddlsim.simulator.cli.calibrate_command import describe_link

    fit = LinkFit(
        (14.42e6, 128 * 2**20), (22.1e-6, 2e-6, 2e-6), (10.19e9, 13.81e9, 13.28e9), call_s=(0.0, 4.39e-4, 0.0182)
    )
    assert describe_link(fit) == (
        "below 14.42 MB: alpha 22.1 us, 10.19 GB/s; 14.42 MB-128 MiB: alpha 2 us, 13.81 GB/s, 0.439 ms a call; "
        "from 128 MiB: alpha 2 us, 13.28 GB/s, 18.2 ms a call"
    )
    assert describe_link(LinkFit((), (5e-6,), (6e9,))) == "all sizes: alpha 5 us, 6 GB/s"


def _collective_time_us(capsys, argv: list[str]) -> list[float]:
    from ddlsim.simulator.cli.main import main

    assert main(["collective", "--algorithm", "ring", "--message-bytes", "64MB", "--ranks", "2,16", *argv]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return [float(line.split()[3]) for line in lines if line.split()[0].isdigit()]


def test_the_collective_command_runs_on_a_profile_and_shows_its_per_call_cost(tmp_path, capsys):
    """ddlsim collective --profile P --device D: the profile's link for D's ring all-reduce replaces the
    datasheet's, and each call pays its 3 ms once, at 2 ranks as at 16."""
    key = "ib_edr@v100_sxm2@ring"
    paths = []
    for name, call in (("plain", ()), ("costly", (3e-3,))):
        path = tmp_path / f"{name}.toml"
        path.write_text(profile_to_toml(Profile(links={key: LinkFit((), (2e-6,), (10e9,), "test", call_s=call)})))
        paths.append(path)
    plain = _collective_time_us(capsys, ["--profile", str(paths[0]), "--device", "v100_sxm2"])
    costly = _collective_time_us(capsys, ["--profile", str(paths[1]), "--device", "v100_sxm2"])
    assert costly == pytest.approx([t + 3000.0 for t in plain], abs=0.01)
    datasheet = _collective_time_us(capsys, [])
    assert datasheet[1] != pytest.approx(plain[1], rel=0.01)  # the fitted 10 GB/s, not EDR's datasheet
    from ddlsim.simulator.cli.main import main

    assert main(["collective", "--profile", str(paths[1]), "--message-bytes", "1MB", "--ranks", "2",
                 "--device", "v100_sxm2"]) == 0  # fmt: skip
    assert "fixed cost per call, 3 ms" in capsys.readouterr().out
    assert main(["collective", "--profile", str(paths[1])]) == 2
    assert "--profile and --device go together" in capsys.readouterr().err
    assert main(["collective", "--device", "v100_sxm2"]) == 2
    assert "without --profile the collective runs on the datasheet links" in capsys.readouterr().err
