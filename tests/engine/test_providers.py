"""OpenRouter provider control: `regen providers`, filters that leave nothing, and answers from
an excluded endpoint never used."""

from __future__ import annotations

import json
from pathlib import Path

from regen.engine.providers import EndpointInfo, excluded_names, verdicts, warnings
from regen.sim import SimConfig, sim_in_thread
from regen.sim.config import SimFaults
from tests.conftest import add_to_section, query, run_cli, write_job


def ep(name: str, tag: str, quant: str | None, max_out: int = 65536) -> EndpointInfo:
    return EndpointInfo(name, tag, quant, 0.5, 2.0, 262144, max_out)


KIMI = [
    ep("Moonshot AI", "moonshotai", "int4"),
    ep("Fireworks", "fireworks/fp4", "fp4"),
    ep("DeepInfra", "deepinfra/fp8", "fp8"),
    ep("DeepInfra", "deepinfra/nvfp4", "nvfp4"),
]


def test_ignore_by_tag_keeps_the_providers_other_endpoints() -> None:
    v = verdicts(KIMI, {"ignore": ["deepinfra/nvfp4", "fireworks/fp4"]}, 4096)
    assert v == {
        "moonshotai": None,
        "fireworks/fp4": "provider.ignore 'fireworks/fp4'",
        "deepinfra/fp8": None,
        "deepinfra/nvfp4": "provider.ignore 'deepinfra/nvfp4'",
    }
    only_excluded, mixed = excluded_names(KIMI, v)
    assert (only_excluded, mixed) == ({"Fireworks"}, {"DeepInfra"})
    # A bare slug drops every endpoint of the provider: said in a warning.
    v = verdicts(KIMI, {"ignore": ["deepinfra"]}, 4096)
    assert v["deepinfra/fp8"] and v["deepinfra/nvfp4"]
    (note,) = warnings(KIMI, {"ignore": ["deepinfra"]}, v)
    assert note.startswith("provider.ignore 'deepinfra' drops all 2 DeepInfra endpoints")


def test_quantization_allow_list_price_and_max_tokens() -> None:
    v = verdicts(KIMI, {"quantizations": ["fp8", "int4"]}, 4096)
    assert [t for t, r in v.items() if r is None] == ["moonshotai", "deepinfra/fp8"]
    assert v["deepinfra/nvfp4"] == "quantization nvfp4 not in provider.quantizations"
    # `fp4` covers nvfp4; an endpoint that states none is left out of an allow-list.
    unstated = [*KIMI, ep("Chutes", "chutes", None)]
    v = verdicts(unstated, {"quantizations": ["fp4"]}, 4096)
    assert v["deepinfra/nvfp4"] is None and v["chutes"] is not None
    assert any(
        "state no quantization (chutes)" in w
        for w in warnings(unstated, {"quantizations": ["fp4"]}, v)
    )
    v = verdicts([ep("A", "a", "fp8", max_out=8192)], None, 16384)
    assert v == {"a": "max_completion_tokens 8192 < max_tokens 16384"}
    v = verdicts(KIMI, {"ignore": ["moonshotai", "fireworks", "deepinfra"]}, 4096)
    assert any("leave no endpoint" in w for w in warnings(KIMI, {"ignore": ["x"]}, v))


def seed_job(tmp: Path, base_url: str, provider: str, rows: int = 30) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    return add_to_section(write_job(tmp, base_url, rows=rows), "endpoint", f"provider = {provider}")


def test_regen_providers_lists_and_marks_what_the_job_excludes(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        job = seed_job(tmp_path, sim.base_url, '{ ignore = ["fireworks/fp4", "deepinfra/nvfp4"] }')
        res = run_cli("providers", "moonshotai/kimi-k2.5", "--job", str(job), "--json")
        assert res.returncode == 0, res.stderr
        data = json.loads(res.stdout)
        used = {e["tag"]: e["excluded_by"] for e in data["endpoints"]}
        assert used == {
            "moonshotai": None,
            "fireworks/fp4": "provider.ignore 'fireworks/fp4'",
            "deepinfra/fp8": None,
            "deepinfra/nvfp4": "provider.ignore 'deepinfra/nvfp4'",
        }
        fw = next(e for e in data["endpoints"] if e["tag"] == "fireworks/fp4")
        assert (fw["quantization"], fw["completion_usd_per_mtok"]) == ("fp4", 2.0)
        res = run_cli("providers", "moonshotai/kimi-k2.5", "--job", str(job))
        assert res.returncode == 0
        assert "excluded: provider.ignore 'fireworks/fp4'" in res.stdout
        res = run_cli("providers", "nobody/nothing", "--base-url", sim.base_url)
        assert res.returncode == 1
        assert "no endpoints listed for model 'nobody/nothing'" in res.stderr


def test_filters_that_leave_nothing_stop_before_anything_is_sent(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        job = seed_job(tmp_path, sim.base_url, '{ quantizations = ["bf16"] }')
        res = run_cli("run", str(job))
        chats = sim.simulator.chat_log()
    assert res.returncode == 1
    line = res.stderr.strip()
    assert line.startswith(
        "error: endpoint 'default': no provider endpoint of moonshotai/kimi-k2.5"
    )
    assert "quantization fp4 not in provider.quantizations" in line and "\n" not in line
    assert chats == []


def test_the_simulator_answers_404_when_filters_leave_nothing(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    with sim_in_thread(SimConfig(seed=1, time_scale=0.0)) as sim:
        body = {
            "model": "moonshotai/kimi-k2.5",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 16,
            "provider": {"quantizations": ["bf16"]},
        }
        req = urllib.request.Request(
            f"{sim.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer sk-x", "Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req)
            raise AssertionError("expected 404")
        except urllib.error.HTTPError as err:
            assert err.code == 404
            error = json.loads(err.read())["error"]
    assert error["availability"]["code"] == "constraint_filtered"
    assert error["availability"]["excluded_by"] == ["quantization"]


def test_an_answer_from_an_excluded_endpoint_is_paid_for_but_never_exported(tmp_path: Path) -> None:
    faults = SimFaults(misroute=0.3)
    with sim_in_thread(SimConfig(seed=2, time_scale=0.0, faults=faults)) as sim:
        # Fireworks' only endpoint is excluded: an answer naming Fireworks came from it.
        job = seed_job(tmp_path, sim.base_url, '{ ignore = ["fireworks/fp4"] }', rows=60)
        res = run_cli("run", str(job))
        served = [e.provider for e in sim.simulator.chat_log() if e.status == 200]
        billed = sim.simulator.billed_usd()
    assert res.returncode in (0, 3), res.stderr
    assert "Fireworks" in served  # the leak happened
    out = tmp_path / "out"
    assert query(out, "SELECT COUNT(*) FROM results WHERE provider = 'Fireworks'") == [(0,)]
    excluded = query(
        out, "SELECT COUNT(*) FROM attempts WHERE failure_class = 'excluded_provider'"
    )[0][0]
    assert excluded == served.count("Fireworks")
    exported = (out / "export" / "chat.jsonl").read_text().splitlines()
    assert len(exported) == query(out, "SELECT COUNT(*) FROM results")[0][0]
    # Every answer was paid for, the excluded ones too: the ledger holds the whole bill.
    (ledger,) = query(out, "SELECT SUM(cost_usd) FROM ledger")[0]
    assert abs(ledger - billed) < 1e-9


def test_on_the_simulator_an_ignored_tag_and_an_allow_list_route_as_documented(
    tmp_path: Path,
) -> None:
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = seed_job(tmp_path / "a", sim.base_url, '{ ignore = ["deepinfra/nvfp4"] }', 80)
        res = run_cli("run", str(job))
        assert res.returncode == 0
        served = [e for e in sim.simulator.chat_log() if e.status == 200]
        tags = {e.endpoint_tag for e in served}
    # DeepInfra still serves, from its fp8 endpoint; its nvfp4 endpoint never.
    assert "deepinfra/fp8" in tags and "deepinfra/nvfp4" not in tags
    # And the run says plainly that DeepInfra's answers cannot be proven per answer, how many
    # there were, and what would keep nvfp4 out at the router.
    assert 'provider.quantizations = ["fp8", "int4"]' in res.stdout
    deepinfra = sum(e.provider == "DeepInfra" for e in served)
    assert f"{deepinfra} answers came from DeepInfra, which also serves from an endpoint" in (
        " ".join(res.stdout.split())
    )
    with sim_in_thread(SimConfig(seed=3, time_scale=0.0)) as sim:
        job = seed_job(tmp_path / "b", sim.base_url, '{ quantizations = ["fp8", "int4"] }', 80)
        assert run_cli("run", str(job)).returncode == 0
        tags = {e.endpoint_tag for e in sim.simulator.chat_log() if e.status == 200}
    assert tags == {"deepinfra/fp8", "moonshotai"}


def test_excluding_one_endpoint_of_a_named_provider_suggests_the_precision_allow_list() -> None:
    """DeepInfra fp8 allowed, nvfp4 ignored: answers name only "DeepInfra", so regen cannot
    prove per answer which one served; the warning says so and offers `quantizations`."""
    prefs = {"ignore": ["deepinfra/nvfp4"]}
    v = verdicts(KIMI, prefs, 4096)
    (note,) = warnings(KIMI, prefs, v)
    assert note.startswith("deepinfra/nvfp4: excluded, but DeepInfra answers from allowed")
    # "fp4" would let nvfp4 in again: the allow-list leaves it out, and says what else goes.
    assert note.endswith(
        'use provider.quantizations = ["fp8", "int4"] (it also drops fireworks/fp4)'
    )
    allow = {"quantizations": ["fp8", "int4"]}
    assert warnings(KIMI, allow, verdicts(KIMI, allow, 4096)) == []
