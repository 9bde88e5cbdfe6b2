"""Several answers per prompt (`samples`): each sample its own item, with its own seed and
settings, added when the count grows, refused when it shrinks, and exported with its index."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from regen.config import DatasetConfig, GenerationConfig, Job
from regen.conversation import Message, Request
from regen.engine.client.body import sample_settings
from regen.sim import SimConfig, sim_in_thread
from tests.conftest import query, run_cli, write_job


def request(sample: int, conversation: str = "c1") -> Request:
    return Request("i", "ds", conversation, 1, (Message("user", "q"),), sample=sample)


def test_a_list_is_cycled_over_a_prompts_samples_and_each_sample_gets_its_own_seed() -> None:
    gen = GenerationConfig(model="m", temperature=[0.2, 0.7, 1.0], top_p=0.9, seed=5)
    sent = [sample_settings(gen, request(k), samples=4) for k in range(4)]
    assert [s["temperature"] for s in sent] == [0.2, 0.7, 1.0, 0.2]
    assert all(s["top_p"] == 0.9 for s in sent)
    seeds = [s["seed"] for s in sent]
    assert len(set(seeds)) == 4 and all(0 <= x < 2**31 for x in seeds)
    # The same prompt and sample always get the same seed (a resend is the same request);
    # another prompt gets others.
    assert sample_settings(gen, request(2), samples=4)["seed"] == seeds[2]
    assert sample_settings(gen, request(2, "c2"), samples=4)["seed"] not in seeds
    # One sample per prompt: the job's seed as it is, and a list drawn per prompt.
    one = sample_settings(gen, request(0), samples=1)
    assert one["seed"] == 5 and one["temperature"] in (0.2, 0.7, 1.0)


def test_draw_picks_each_samples_values_by_a_seeded_draw() -> None:
    gen = GenerationConfig(
        model="m",
        temperature=[0.1, 0.5, 0.9, 1.3],
        mix="draw",
        reasoning={"effort": ["low", "high"]},
    )
    draws = [sample_settings(gen, request(k, f"c{k // 8}"), samples=8) for k in range(64)]
    assert {d["temperature"] for d in draws} == {0.1, 0.5, 0.9, 1.3}
    assert {d["reasoning"]["effort"] for d in draws} == {"low", "high"}
    again = [sample_settings(gen, request(k, f"c{k // 8}"), samples=8) for k in range(64)]
    assert again == draws


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mode": "sequential", "samples": 2}, "samples > 1 with mode sequential"),
        ({"samples": 0}, "greater than or equal to 1"),
    ],
)
def test_samples_settings_that_cannot_hold_are_refused(change: dict, message: str) -> None:
    ds = {"name": "d", "path": "x.jsonl", **change}
    with pytest.raises(ValueError, match=message):
        Job.model_validate(
            {"generation": {"model": "m"}, "endpoint": {}, "datasets": [DatasetConfig(**ds)]}
            if "samples" not in change or change["samples"]
            else {"generation": {"model": "m"}, "datasets": [ds]}
        )


def test_n_in_extra_body_points_to_samples() -> None:
    with pytest.raises(
        ValueError, match=r"n in extra_body: answers per prompt are \[generation\] samples"
    ):
        Job.model_validate(
            {
                "generation": {"model": "m"},
                "endpoint": {"extra_body": {"n": 2}},
                "datasets": [{"name": "d", "path": "x.jsonl"}],
            }
        )


def per_prompt(out: Path) -> dict[tuple[str, int], list[tuple[int, dict]]]:
    got: dict[tuple[str, int], list[tuple[int, dict]]] = defaultdict(list)
    for cid, turn, sample, settings in query(
        out,
        "SELECT i.conversation_id, i.turn_index, i.sample, r.settings FROM items i "
        "JOIN results r ON r.item_id = i.id",
    ):
        got[(cid, turn)].append((sample, json.loads(settings)))
    return got


def test_a_samples_job_grows_refuses_to_shrink_and_exports_each_sample(tmp_path: Path) -> None:
    with sim_in_thread(SimConfig(seed=4, time_scale=0.0)) as sim:
        job = write_job(tmp_path, sim.base_url)
        text = job.read_text().replace(
            "temperature = 0.7", "temperature = [0.2, 0.9]\nsamples = 3\nseed = 11"
        )
        job.write_text(text)
        res = run_cli("run", str(job))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "dataset chat: new, 60 items (items are samples: 3 per prompt)" in res.stdout
        prompts = per_prompt(tmp_path / "out")
        assert len(prompts) == 20  # write_job's 20 chat rows
        for samples in prompts.values():
            samples.sort(key=lambda s: s[0])
            assert [k for k, _ in samples] == [0, 1, 2]
            assert [s["temperature"] for _, s in samples] == [0.2, 0.9, 0.2]
            assert len({s["seed"] for _, s in samples}) == 3
        # The simulator answers a seed differently: three answers per prompt, not one thrice.
        contents = query(tmp_path / "out", "SELECT content FROM results")
        assert len({c for (c,) in contents}) > 20
        # More samples: the next run adds the new ones, and says so.
        job.write_text(text.replace("samples = 3", "samples = 4"))
        res = run_cli("run", str(job))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "samples 3 -> 4: adds 1 per prompt" in res.stdout
        prompts = per_prompt(tmp_path / "out")
        assert all(sorted(k for k, _ in s) == [0, 1, 2, 3] for s in prompts.values())
        sent_before = len(sim.simulator.chat_log())
        # Fewer: refused, nothing sent.
        job.write_text(text.replace("samples = 3", "samples = 2"))
        res = run_cli("run", str(job))
        assert res.returncode != 0
        assert "samples went down from 4 to 2" in res.stderr
        assert len(sim.simulator.chat_log()) == sent_before
    out = tmp_path / "out"
    to = tmp_path / "x"
    res = run_cli("export", str(out), "--to", str(to), "--format", "openai", "--keep-truncated")
    assert res.returncode == 0, res.stderr
    recs = [json.loads(x) for x in (to / "train" / "chat.jsonl").read_text().splitlines()]
    assert sorted({r["provenance"]["sample"] for r in recs}) == [0, 1, 2, 3] and len(recs) == 80
    res = run_cli(
        "export", str(out), "--to", str(to), "--format", "openai", "--keep-truncated",
        "--samples", "first",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    firsts = [json.loads(x) for x in (to / "train" / "chat.jsonl").read_text().splitlines()]
    assert len(firsts) == 20 and {r["provenance"]["sample"] for r in firsts} == {0}
    manifest = json.loads((to / "manifest.json").read_text())
    assert manifest["datasets"]["chat"]["dropped"]["other_sample"] == 60


def test_only_samples_sent_the_same_settings_wait_to_share_a_request() -> None:
    """A temperature list tells samples apart: they cannot be one request with `n`, so none
    waits for the others (the batcher passes a sample that shares with nobody at once)."""
    from regen.run.lanes import sharing

    mixed = GenerationConfig(model="m", temperature=[0.2, 0.7, 1.0])
    assert [sharing(mixed, request(k), 4) for k in range(4)] == [2, 1, 1, 2]
    plain = GenerationConfig(model="m", temperature=0.7, seed=3)
    assert [sharing(plain, request(k), 4) for k in range(4)] == [4, 4, 4, 4]
