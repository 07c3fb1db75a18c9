"""End to end on the micro preset: `experiments/run.py` runs table6_both and a Table 4 row (sharing its SFT
stage), writes results.json / results.md (with the MTP draft acceptance of the final checkpoint), refuses bad input,
resumes, and the notebook executes on the outputs."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hat_jax.experiments.results import check_results

ROOT = Path(__file__).resolve().parents[2]
# Seconds-long stages: the micro presets with fewer steps.
FAST = ["--set", "sft.steps=3", "--set", "rl.steps=1", "--set", "opd.steps=1", "--set", "base.steps=3"]


def _load_run():
    spec = importlib.util.spec_from_file_location("run_cli", ROOT / "experiments" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One output root with table6_both and table4_hsa_opd run on micro (module-scoped: the slow part)."""
    out = tmp_path_factory.mktemp("runs")
    env = pytest.MonkeyPatch()
    env.setenv("HAT_JAX_CACHE", str(tmp_path_factory.mktemp("cache")))
    run = _load_run()
    for exp in ("table6_both", "table4_hsa_opd"):
        assert run.main(["--exp", exp, "--preset", "micro", "--out", str(out), "--no-progress", *FAST]) == 0
    yield out, run
    env.undo()


def test_results_follow_the_schema_and_share_the_sft_stage(runs):
    out, _ = runs
    both = json.loads((out / "table6_both" / "results.json").read_text())
    check_results(both)
    assert both["experiment"] == "table6_both" and both["preset"] == "micro" and both["seeds"] == [0]
    assert [(s["name"], s["harness"], s["steps"]) for s in both["stages"]] == [("sft", "hsa", 3), ("rl", "hsa", 1)]
    assert both["metrics"]["ifeval_mini"] is not None and set(both["metrics"]["live_qa"]) == {
        "acc", "eff", "avg", "name_valid", "skill_acc", "chain_done", "fact_fetched", "relayed", "abstained",
        "calls_per_ep"}
    row4 = json.loads((out / "table4_hsa_opd" / "results.json").read_text())
    check_results(row4)
    assert [(s["name"], s["cached"]) for s in row4["stages"]] == [("sft", True), ("opd", False)]
    assert row4["stages"][0]["dirs"] == both["stages"][0]["dirs"]           # one SFT run dir for both rows
    assert Path(row4["stages"][1]["dirs"][0], "stage_done.json").is_file()
    md = (out / "table6_both" / "results.md").read_text()
    assert "| Live QA avg |" in md and "| IFEval prompt strict |" in md and "81.3" in md
    assert "| Variant QA name validity |" in md and "| Live QA calls / episode |" in md
    # per-item scores from the evaluation's files; 2 items per suite: no item bootstrap, and results.md says why
    assert both["items"]["live_qa"]["ids"] == ["live_qa-00000", "live_qa-00001"] and both["eval_key"]
    assert len(both["items"]["ifeval_mini"]["scores"]["prompt_strict"][0]) == 3
    # the row's evaluation folder, from which experiments/episodes.py reads the episodes
    from hat_jax.experiments.episodes import episodes_of, suite_files
    (live,) = suite_files(out / "table6_both", ["live_qa"])
    assert both["eval_dirs"] == [live.parent.relative_to(out).as_posix()] and len(episodes_of(live)) == 2
    assert "live_qa has 2 items; an item bootstrap needs at least 20" in both["interval_method"]["live_qa"]
    assert ("- Live QA: no interval: 1 seed, and the item bootstrap is refused: table6_both: live_qa has 2 items; "
            "an item bootstrap needs at least 20") in md
    assert "(pretrained here)" in md and "base cached (pretrained once in" in (out / "table4_hsa_opd" / "results.md").read_text()
    # wall_s counts what this experiment trained: table4_hsa_opd reuses the SFT stage, so it is not counted
    assert row4["wall_s"] == pytest.approx(row4["stages"][1]["wall_s"] + sum(row4["eval_wall_s"]), abs=0.01)
    if both["metrics"]["ifeval"] is None:
        assert "IFEval skipped:" in md and "--ifeval-data FILE" in md


def test_results_carry_the_mtp_acceptance_of_the_final_checkpoint(runs):
    from hat_jax.eval.runner import _mtp_acceptance
    from hat_jax.experiments.scales import get_scale
    from hat_jax.rollout import load_sampler

    out, _ = runs
    both = json.loads((out / "table6_both" / "results.json").read_text())
    mtp = both["mtp"]
    (seed,) = mtp["per_seed"]
    final = both["stages"][-1]["dirs"][0]
    assert seed["seed"] == 0 and seed["checkpoint"] == final and seed["episodes"] == mtp["episodes"] == 2
    # the same figures measured afresh on the final checkpoint with the micro eval config
    config = get_scale("micro").eval
    sampler = load_sampler(final, config.compute_dtype, bucket=config.bucket)
    seq_len = min(config.seq_len, sampler.model_config.max_position_embeddings - config.max_new_tokens)
    figures, extra = _mtp_acceptance(sampler, config, seq_len)
    assert {k: seed[k] for k in figures} == figures and figures["positions"] > 0
    assert mtp["acceptance_depth1"] == round(figures["acceptance_depth1"], 6)
    assert mtp["mean_accepted_length"] == round(1 + figures["acceptance_depth1"], 6)
    assert mtp["positions"] == figures["positions"] and both["extra"][0]["mtp"]["items"] == 2
    md = (out / "table6_both" / "results.md").read_text()
    section = md[md.index("## MTP draft acceptance"):]
    assert section.startswith(f"## MTP draft acceptance\n\nDepth-1 acceptance {mtp['acceptance_depth1']:.4f}, mean "
                              f"accepted length {mtp['mean_accepted_length']:.4f}; {mtp['positions']} positions in 2 "
                              "held-out Live QA oracle episodes.")
    assert f"spec_decode_bench.py --checkpoint {final} --k 1" in section
    # the cached evaluation holds them too, so a row reusing this final stage reports the same figures
    (cached,) = [p for p in (out / "evals").glob("*/seed0/*/metrics.json")
                 if json.loads(p.read_text())["checkpoint"] == final]
    assert json.loads(cached.read_text())["metrics"]["mtp"] == figures


def test_rerun_refuses_or_resumes(runs):
    out, run = runs
    args = ["--exp", "table6_both", "--preset", "micro", "--out", str(out), "--no-progress", *FAST]
    with pytest.raises(FileExistsError, match="pass --resume"):
        run.main(args)
    assert run.main(args + ["--resume"]) == 0                       # finished: returns its results.json
    with pytest.raises(ValueError, match=r"another configuration.*sft.*steps"):
        run.main(args + ["--set", "sft.steps=4", "--resume"])          # the later --set wins


def test_group_checks_every_row_before_training(runs):
    out, run = runs
    before = sorted(p.name for p in out.iterdir())
    # table6_both already ran in `out`: without --resume the group is refused before any other row trains
    with pytest.raises(FileExistsError, match="table6_both"):
        run.main(["--exp", "table6", "--preset", "micro", "--out", str(out), "--no-progress", *FAST])
    assert sorted(p.name for p in out.iterdir()) == before


def test_cli_errors_name_the_bad_input(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=300)

    res = cli("--exp", "table6_bot", "--out", str(tmp_path))
    assert res.returncode == 2 and "did you mean: table6_both" in res.stderr
    res = cli("--exp", "table6_both", "--preset", "tinny", "--out", str(tmp_path))
    assert res.returncode == 2 and "did you mean 'tiny'" in res.stderr
    res = cli("--exp", "table6_both", "--set", "sftt.steps=3", "--out", str(tmp_path))
    assert res.returncode == 2 and "unknown section 'sftt'" in res.stderr and "valid sections: base, sft" in res.stderr
    res = cli("--exp", "table6_both", "--set", "sft.stepz=3", "--out", str(tmp_path))
    assert res.returncode == 2 and "unknown field 'stepz'" in res.stderr
    res = cli("--list")
    assert res.returncode == 0 and "table6_both" in res.stdout and "table4_hsa_rl_hsa" in res.stdout


def test_notebook_executes_on_the_micro_outputs(runs):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    out, _ = runs
    nb = nbformat.read(ROOT / "notebooks" / "ablations.ipynb", as_version=4)
    env = {"HAT_RUNS": str(out), "HAT_GROUP": "table6"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "1 of 4 rows finished" in outputs
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 3
