"""``ddlsim list workloads|devices|links`` shows the transformer catalog and this era's hardware."""

from __future__ import annotations

from ddlsim.simulator.cli.main import main


def listed(capsys, kind: str) -> dict[str, str]:
    assert main(["list", kind]) == 0
    return {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}


def test_workloads_list_tables_and_transformers_with_parameters_and_kind(capsys) -> None:
    lines = listed(capsys, "workloads")
    assert lines["resnet50"].split()[1:4] == ["table", "25.6", "M"]
    assert lines["llama3_70b"].split()[1:4] == ["decoder", "70.55", "B"]
    assert lines["mixtral_8x7b"].split()[1:4] == ["decoder_moe", "46.70", "B"]
    assert lines["t5_base"].split()[1:4] == ["encoder_decoder", "222.9", "M"]
    assert lines["bert_large"].split()[1] == "encoder"
    assert "seq 2048, 471.2 GFLOP/token" in lines["megatron_76b"]
    assert {"gpt3_175b", "megatron_76b", "bert_large", "deepseek_v3", "llama3_405b"} <= set(lines)


def test_devices_and_links_show_this_era(capsys) -> None:
    devices = listed(capsys, "devices")
    assert devices["h100_sxm5"].split()[1:4] == ["67.0", "989.0", "1979.0"]
    assert devices["a100_sxm4"].split()[3] == "-"
    links = listed(capsys, "links")
    assert "domain    72" in links["nvl72"]
    assert "gb300" in devices and "tpu_v5p" in devices and "roce_400g" in links
