"""bench/evidence_real.py without training: every arm is a valid config, the verdict rule, and the summary's pairing,
curve fits and plots on recorded runs (the runs themselves take minutes each on the real model)."""

from __future__ import annotations

import json
import math
import random

import pytest
from conftest import load_bench_script


@pytest.fixture(scope="module")
def evidence():
    return load_bench_script("evidence_real")


def test_every_arm_builds_its_config_and_every_comparison_names_two_arms(evidence, tmp_path):
    from trl_reasoning.models.tiny import cpu_config_kwargs

    for claim, spec in evidence.CLAIMS.items():
        for pair in spec["compare"]:
            assert {pair["a"], pair["b"]} <= set(spec["arms"]), claim
            assert pair["expects"] in ("higher", "lower")
            assert pair["tests"] and isinstance(pair["paper"], bool)
        unit, budget = evidence.claim_budget(claim, 4000)
        assert (unit, budget) == ((spec["unit"], spec["budget"]) if "unit" in spec else ("tokens", 4000))
        for arm, settings in spec["arms"].items():
            settings = dict(settings)
            trainer_class = evidence._preset_trainer(settings.pop("preset", None))
            job = {"output_dir": str(tmp_path / arm), "seed": 0}
            config = trainer_class.config_class(**{**evidence._run_settings(job, cpu_config_kwargs()), **settings})
            assert config.seed == 0, (claim, arm)


def test_the_off_policy_arms_run_in_pipelinerl_8_and_differ_only_in_the_loss(evidence):
    arms = evidence.CLAIMS["async_k8"]["arms"]
    assert evidence.CLAIMS["async_k8_long"]["arms"] == arms  # the same arms over 50 steps
    # the two clip arms differ only in the anchor: TRL's objective (v4's baseline) and the papers' (the sampler)
    assert (arms["clip"]["ratio_anchor"], arms["clip_sampler"]["ratio_anchor"]) == ("pi_old", "sampler")
    loss_fields = {"policy_loss", "epsilon", "epsilon_high", "dppo_divergence", "ratio_anchor"}
    shared = [{k: v for k, v in arm.items() if k not in loss_fields} for arm in arms.values()]
    assert all(s == shared[0] for s in shared)
    assert shared[0]["async_rollouts"] is True and shared[0]["max_staleness"] == 8
    assert "steps_per_generation" not in shared[0]
    higher = evidence.CLAIMS["clip_higher"]["arms"]
    differ = {k for k in higher["eps_high_0.28"] if higher["eps_high_0.28"][k] != higher["eps_high_0.20"].get(k)}
    assert differ == {"epsilon_high"}


def test_the_paper_rows_compare_against_each_paper_s_own_baseline_and_unit(evidence):
    """DPPO's asynchronous claims are against the clip on pi/mu (the DPPO paper's GRPO baseline); CISPO against that
    clip is no paper's claim (MiniMax-M1 never made it); DAPO's dynamic-sampling claim is in optimizer steps; the rows
    against TRL's objective or in tokens are no paper's claim."""
    paper_rows = {
        (claim, p["a"], p["b"]) for claim, spec in evidence.CLAIMS.items() for p in spec["compare"] if p["paper"]
    }
    for claim in ("async_k8", "async_k8_long"):
        assert {(a, b) for c, a, b in paper_rows if c == claim} == {
            ("dppo_binary", "clip_sampler"),
            ("dppo_topk", "clip_sampler"),
        }
        assert (claim, "cispo", "clip_sampler") not in paper_rows
    assert ("dynamic_sampling_steps", "on", "off") in paper_rows
    assert ("dynamic_sampling", "on", "off") not in paper_rows
    assert evidence.claim_budget("dynamic_sampling_steps", 4000) == ("steps", 17)
    assert evidence.claim_budget("async_k8_long", 4000)[1] >= 50


def _differing(arms: dict) -> set[str]:
    first, second = arms.values()
    return {key for key in first.keys() | second.keys() if first.get(key) != second.get(key)}


def test_the_successors_rows_change_one_thing_against_each_paper_s_baseline(evidence):
    """GSPO against its paper's GRPO (the token ratio at 0.2 / 0.27) on long completions, off-policy both ways, in
    steps; REINFORCE++-baseline against GRPO by the estimator alone; ProRL's reset against the same run without it, a
    comparison ProRL never reported (it resets by hand), so no paper's claim."""
    for claim in ("gspo_stale", "gspo_async_k8"):
        spec = evidence.CLAIMS[claim]
        assert _differing(spec["arms"]) == {"policy_loss", "epsilon", "epsilon_high"}, claim
        gspo, grpo = spec["arms"]["gspo"], spec["arms"]["grpo"]
        assert (gspo["policy_loss"], gspo["epsilon"], gspo["epsilon_high"]) == ("gspo", 3e-4, 4e-4)
        assert (grpo["policy_loss"], grpo["epsilon"], grpo["epsilon_high"]) == ("clip", 0.2, 0.27)
        assert gspo["max_completion_length"] >= 64 and gspo["loss_aggregation"] == "seq_mean_token_mean"
        assert spec["unit"] == "steps" and spec["seeds"] >= 4
    assert evidence.CLAIMS["gspo_stale"]["arms"]["gspo"]["steps_per_generation"] == 4
    assert evidence.CLAIMS["gspo_async_k8"]["arms"]["gspo"]["max_staleness"] == 8
    reinforce = evidence.CLAIMS["reinforce_pp_mixed"]["arms"]
    assert _differing(reinforce) == {"advantage_estimator"}
    assert reinforce["reinforce_pp_baseline"]["advantage_estimator"] == "reinforce_pp_baseline"
    prorl = evidence.CLAIMS["prorl_reset"]
    assert _differing(prorl["arms"]) == {"reference_reset_steps"}
    assert prorl["budget"] > 3 * prorl["arms"]["reset"]["reference_reset_steps"]  # resets happen within the run
    assert all(
        pair["paper"] for claim in ("gspo_stale", "reinforce_pp_mixed") for pair in evidence.CLAIMS[claim]["compare"]
    )
    assert not any(pair["paper"] for pair in prorl["compare"])


@pytest.mark.parametrize(
    ("differences", "expects", "said"),
    [
        ([0.1, 0.12, 0.09, 0.11, 0.1, 0.13, 0.08, 0.1], "higher", "reproduces"),
        ([0.1, 0.12, 0.09, 0.11, 0.1, 0.13, 0.08, 0.1], "lower", "opposite"),
        ([0.1, 0.12, 0.09, 0.11], "higher", "reproduces at 4 seeds (a small effect needs >= 8)"),
        ([0.1, -0.12, 0.09, -0.11, 0.1, -0.13, 0.08, 0.0], "higher", "not resolved"),
        ([0.1, 0.2], "higher", "not resolved (fewer than 3 seeds)"),
    ],
)
def test_verdict_rule(evidence, differences, expects, said):
    verdict, mean, low, high = evidence.verdict(differences, expects)
    # a comparison no paper made says only which arm is higher
    unclaimed, *_ = evidence.verdict(differences, expects, paper=False)
    direction = f"A {'higher' if mean > 0 else 'lower'}"
    assert unclaimed == said.replace("reproduces", direction).replace("opposite", direction)
    assert verdict == said
    assert mean == pytest.approx(sum(differences) / len(differences))
    assert low < mean < high


def _run(claim: str, arm: str, seed: int, pass1: float, asymptote: float) -> dict:
    rng = random.Random(seed * 31 + len(arm))
    curve = []
    for step in range(1, 21):
        tokens = 200 * step
        reward = 0.2 + (asymptote - 0.2) / (1 + (1500 / tokens) ** 1.5) + rng.gauss(0, 0.005)
        curve.append([tokens, reward])
    return {
        "claim": claim,
        "arm": arm,
        "seed": seed,
        "budget": 4000,
        "pass@1": pass1,
        "pass@8": min(1.0, 2 * pass1),
        "incorrect_length": 20.0 + 10 * pass1,
        "entropy_end": 1.0 + pass1,
        "steps": 20,
        "clip_fraction": 0.01,
        "sampler_ratio_abs_log": 0.02,
        "curve": curve,
        "load": 2.0,
        "wall_s": 500.0,
    }


def test_summary_pairs_each_comparison_by_seed_and_fits_each_arms_curves(evidence, tmp_path, monkeypatch):
    runs = {}
    for seed in range(4):
        for arm, gain in (
            ("clip", 0.0),
            ("clip_sampler", 0.0),
            ("cispo", 0.1),
            ("dppo_binary", 0.05),
            ("dppo_topk", -0.02),
        ):
            runs[f"async_k8/{arm}/{seed}/4000"] = _run("async_k8", arm, seed, 0.3 + gain + 0.01 * seed, 0.6 + gain)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    recorded = {}
    monkeypatch.setattr(evidence, "RUNS", path)
    monkeypatch.setattr(evidence, "PLOT", tmp_path / "effects.png")
    monkeypatch.setattr(evidence, "CURVES_PLOT", tmp_path / "curves.png")
    monkeypatch.setattr(evidence, "record", lambda section, table: recorded.update({section: table}))
    monkeypatch.setattr(evidence, "_write_docs_table", lambda table: recorded.update({"docs": table}))
    table = evidence.main(["--summarize"])
    assert table in recorded.values()
    rows = [line for line in table.splitlines() if line.startswith("| async_k8 |")]
    comparisons = [row for row in rows if " − " in row]
    assert len(comparisons) == 7  # the decoupled clip's row has no runs here
    cispo = next(row for row in comparisons if "cispo − clip_sampler" in row)
    # no paper compared CISPO with the clip on pi/mu: the verdict says which arm is higher, never "reproduces"
    assert "+0.100" in cispo and "| 4 |" in cispo and "A higher at 4 seeds" in cispo and "reproduces" not in cispo
    binary = next(row for row in comparisons if "dppo_binary − clip_sampler" in row)
    assert "reproduces at 4 seeds" in binary
    topk = next(row for row in comparisons if "dppo_topk − clip_sampler" in row)
    assert "opposite at 4 seeds" in topk
    # against TRL's objective no paper claimed anything: the verdict only says which arm is higher
    topk_trl = next(row for row in comparisons if "dppo_topk − clip |" in row)
    assert "A lower at 4 seeds" in topk_trl and "opposite" not in topk_trl
    # the docs' narrow table has the same rows: the claim tested, the effect with its interval, the verdict
    docs = recorded["docs"].splitlines()
    assert len(docs) == 2 + 7 and all(line.count("|") == 7 for line in docs)
    assert any(line.startswith("| DPPO top-K TV over its baseline") and "opposite at 4 seeds" in line for line in docs)
    fits = evidence.curve_fits(runs, 4000)
    assert set(fits) == {("async_k8", arm) for arm in ("clip", "clip_sampler", "cispo", "dppo_binary", "dppo_topk")}
    asymptote = sum(fit.A for fit, _ in fits[("async_k8", "cispo")]) / 4
    assert math.isclose(asymptote, 0.7, abs_tol=0.05)
    assert (tmp_path / "effects.png").exists() and (tmp_path / "curves.png").exists()
    # Seeds 4-7 of async_k8's four arms and every other claim's runs are still to do, and the summary says so.
    # seeds 4-7 of the five arms recorded, all eight of the decoupled clip's, and the long rows' four seeds each
    assert "more runs (maxrl_passk 16, " in table and "async_k8 28" in table and "async_k8_long 24" in table
    assert "Every recorded run kept its curve." in table


def test_summary_names_runs_without_curves_and_says_when_every_seed_is_in(evidence, tmp_path, monkeypatch):
    runs = {}
    for claim, spec in evidence.CLAIMS.items():
        for arm in spec["arms"]:
            budget = evidence.claim_budget(claim, 4000)[1]
            for seed in range(spec.get("seeds", 8)):
                runs[f"{claim}/{arm}/{seed}/{budget}"] = {**_run(claim, arm, seed, 0.3, 0.6), "budget": budget}
    for seed in (0, 1, 2, 5):
        del runs[f"maxrl_passk/grpo/{seed}/4000"]["curve"]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    monkeypatch.setattr(evidence, "RUNS", path)
    monkeypatch.setattr(evidence, "PLOT", tmp_path / "effects.png")
    monkeypatch.setattr(evidence, "CURVES_PLOT", tmp_path / "curves.png")
    monkeypatch.setattr(evidence, "record", lambda section, table: None)
    monkeypatch.setattr(evidence, "_write_docs_table", lambda table: None)
    table = evidence.main(["--summarize"])
    assert "Every arm of every claim has its seeds" in table and "more runs" not in table
    assert "not in this table: maxrl_passk/grpo seeds 0-2, 5." in table
    grpo_fits = next(line for line in table.splitlines() if line.startswith("| maxrl_passk | grpo |"))
    assert grpo_fits.split("|")[3].strip() == "4"


def test_the_docs_page_holds_the_table_of_the_recorded_runs(evidence):
    """docs/which-preset.md quotes the claims' table; it must be the one the recorded runs give (rerun
    ``python bench/evidence_real.py --summarize`` after adding runs)."""
    path, block = evidence.marker_blocks().read_block("evidence")
    assert path.name == "which-preset.md"
    table, _ = evidence.comparison_table(evidence.read_runs(evidence.RUNS), evidence.DEFAULT_BUDGET)
    assert block == table


def test_a_flat_fit_is_counted_and_left_out_of_b_and_c_mid(evidence):
    """A run whose reward never rises gives a sigmoid with no rise inside the data (C_mid far away, or B near 0):
    its B and C_mid are not identified, so the fit table counts it as flat and keeps it out of their intervals."""
    rising = [_run("async_k8", "clip", seed, 0.3, 0.7) for seed in range(3)]
    flat = _run("async_k8", "clip", 3, 0.3, 0.7)
    flat["curve"] = [[tokens, 0.2 + 0.01 * ((-1) ** step)] for step, (tokens, _) in enumerate(flat["curve"])]
    runs = {f"async_k8/clip/{run['seed']}/4000": run for run in rising + [flat]}
    fits = evidence.curve_fits(runs, 4000)[("async_k8", "clip")]
    rises = sorted(rise for _, rise in fits)
    assert rises[0] < evidence._RISE_PLACED <= rises[1]
    (row,) = [line for line in evidence._fit_rows({("async_k8", "clip"): fits}) if line.startswith("| async_k8")]
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    assert cells[2:5] == ["4", "0", "1"]  # runs, A at 1, flat
    c_mid = float(cells[8].split(" ")[0])
    assert 1000 < c_mid < 2200  # the three rising runs' midpoint (1500), untouched by the flat one


def test_every_off_policy_arm_records_its_sampler_ratio(evidence):
    """CISPO and DPPO log the package's ``async/sampler_ratio``; the clip, which uses TRL's correction, logs TRL's
    ``sampling_logp_difference`` (the same mean |log(pi/mu)|): the run records whichever its arm has."""
    own = [{"loss": 1.0, "async/sampler_ratio/abs_log_mean": 0.02}, {"loss": 1.0}]
    trl = [{"loss": 1.0, "sampling/sampling_logp_difference/mean": 0.03}]
    assert evidence._sampler_log_ratios(own) == [0.02]
    assert evidence._sampler_log_ratios(trl) == [0.03]
    assert evidence._sampler_log_ratios([{"loss": 1.0}]) == []
