"""The ablation declarations: the repository's tables load, and malformed files are named errors."""

from pathlib import Path

import pytest

from hat_jax.experiments.declarations import DeclarationError, StageSpec, load_all, load_group, parse_stage, resolve


def test_repository_tables_load_with_the_paper_rows():
    groups = load_all()
    assert set(groups) == {"table3", "table4", "table5", "table6", "rl_estimator"}
    assert [r.name for r in groups["table6"].rows] == ["table6_standard", "table6_rl_only", "table6_sft_only",
                                                       "table6_both"]
    assert len(groups["table4"].rows) == 7
    both = resolve("table6_both", groups)[1][0]
    assert both.chain == (StageSpec("sft", "hsa"), StageSpec("rl", "hsa"))
    assert both.paper == {"ifeval.prompt_strict": 81.3, "live_qa.avg": 93.3}
    # HAT is the same chain in Table 3 and Table 4, so the two rows share every stage.
    assert resolve("table3_hat", groups)[1][0].chain == resolve("table4_hsa_rl_hsa", groups)[1][0].chain
    assert resolve("table3_base", groups)[1][0].chain == ()


def test_group_name_resolves_to_all_rows_and_unknown_names_list_close_matches():
    groups = load_all()
    group, rows = resolve("table4", groups)
    assert group.name == "table4" and len(rows) == 7
    with pytest.raises(KeyError, match="did you mean: table6_both"):
        resolve("table6_bot", groups)


def test_parse_stage():
    assert parse_stage("opd:general", "x") == StageSpec("opd", "general")
    assert StageSpec("opd", "general").harness == "original" and StageSpec("rl", "hsa").harness == "hsa"
    with pytest.raises(DeclarationError, match=r"x: unknown stage 'rl:general'; valid: sft:original"):
        parse_stage("rl:general", "x")
    with pytest.raises(DeclarationError, match="expected a stage 'kind:variant'"):
        parse_stage("sft", "x")


@pytest.mark.parametrize("body, message", [
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: t9_a, description: d, chain: ['sft:hsa'], "
     "paper: {live_qa.avgg: 1}}\n", r"rows\[0\] \(t9_a\)\.paper\.live_qa\.avgg: unknown metric path; did you mean "
                                   r"\['live_qa.avg'"),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: other_a, description: d, chain: []}\n",
     r"rows\[0\] \(other_a\)\.name: 'other_a' must start with the group name 't9_'"),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: t9_a, chain: []}\n",
     r"rows\[0\] \(t9_a\): missing field 'description'"),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: t9_a, description: d, chain: ['sft:x']}\n",
     r"rows\[0\] \(t9_a\)\.chain\[0\]: unknown stage 'sft:x'"),
    ("group: t9\ntitle: x\ncolumns: live_qa.avg\nrows: []\n", r"columns: expected list, got str"),
    ("group: [t9\n", "cannot read the declaration"),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrowz: []\n", r"t9\.yaml: unknown key 'rowz' \(did you mean 'rows'\?\)"),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: t9_a, description: d, chain: [], papers: {}}\n",
     r"t9\.yaml\.rows\[0\] \(t9_a\): unknown key 'papers' \(did you mean 'paper'\?\); valid: name, description, "),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: t9_a, description: d, chain: []}\n"
     "differences:\n  - {name: d, minuend: t9_a, subtrahend: t9_a, paperr: {}}\n",
     r"differences\[0\]: unknown key 'paperr'"),
])
def test_malformed_declarations_name_the_field(tmp_path: Path, body, message):
    path = tmp_path / "t9.yaml"
    path.write_text(body)
    with pytest.raises(DeclarationError, match=message):
        load_group(path)


def test_a_row_declared_twice_across_files_is_refused(tmp_path: Path):
    row = "group: {g}\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {{name: t9_a, description: d, chain: []}}\n"
    (tmp_path / "a.yaml").write_text(row.format(g="t9"))
    (tmp_path / "b.yaml").write_text(row.format(g="t9"))
    with pytest.raises(DeclarationError, match="group 't9' is also declared"):
        load_all(tmp_path)
    with pytest.raises(FileNotFoundError, match="no ablation declarations"):
        load_all(tmp_path / "missing")


ROW = "group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {{name: t9_a, description: d, chain: [{stage}]}}\n"


@pytest.mark.parametrize("stage, message", [
    ("{stage: 'rl:hsa', set: {estimatorr: gdpo}}",
     r"t9\.yaml\.rows\[0\] \(t9_a\)\.chain\[0\]\.set\.estimatorr: unknown field 'estimatorr' of RLConfig \(did you "
     r"mean 'estimator'\?\)"),
    ("{stage: 'rl:hsa', set: {reward.cot_fre: 50}}", r"chain\[0\]\.set\.reward\.cot_fre: unknown field 'cot_fre' of "),
    ("{stage: 'rl:hsa', set: {estimator: ppo}}", r"set\.estimator: unknown advantage estimator 'ppo'"),
    ("{stage: 'sft:hsa', set: {data.hsa.probs: {rename_toolz: 0.0}}}",
     r"t9\.yaml\.rows\[0\] \(t9_a\)\.chain\[0\]\.set\.data\.hsa\.probs: HSAConfig: unknown transform 'rename_toolz'"),
    ("{stage: 'rl:hsa', set: {group_size: big}}", r"set\.group_size: expected a value of type int, got '\"big\"'"),
    ("{stage: 'rl:hsa', set: {seed: 3}}",
     r"t9\.yaml\.rows\[0\] \(t9_a\)\.chain\[0\]\.set\.seed: set by the experiment chain for rl:hsa: .*--seeds"),
    ("{stage: 'rl:original', set: {harness_mode: hsa}}", r"set\.harness_mode: set by the experiment chain .*variant"),
    ("{stage: 'opd:general', set: {teacher: /t}}", r"set\.teacher: set by the experiment chain for opd:general"),
    ("{stage: 'sft:hsa', set: {data.seed: 1}}", r"set\.data\.seed: set by the experiment chain"),
    ("{stage: 'sft:original', set: {data.p_hsa: 0.3}}", r"set\.data\.p_hsa: set by the experiment chain for "
                                                         r"sft:original: .*use sft:hsa"),
    ("{stage: 'sft:hsa', set: {model.hidden_size: 8}}", r"set\.model\.hidden_size: a stage's model is its init"),
    ("{stage: 'sft:hsa', set: {optim: 3}}", r"set\.optim: 'optim' is a section \(OptimConfig\), not a value"),
    ("{stage: 'rl:hsa', sett: {beta: 0.1}}", r"chain\[0\]: unknown key 'sett' \(did you mean 'set'\?\); valid: stage, set"),
    ("{stage: 'rl:gdpo'}", r"chain\[0\]\.stage: unknown stage 'rl:gdpo'"),
    ("{set: {beta: 0.1}}", r"chain\[0\]: missing field 'stage'"),
    ("{stage: 'rl:hsa', set: [beta]}", r"chain\[0\]\.set: expected a mapping of field path -> value"),
])
def test_bad_stage_overrides_name_the_file_row_and_key(tmp_path: Path, stage, message):
    """Refused at load, against the stage's config class: no scale is needed to find the typo."""
    path = tmp_path / "t9.yaml"
    path.write_text(ROW.format(stage=stage))
    with pytest.raises(DeclarationError, match=message):
        load_group(path)


def test_stage_overrides_load_in_order_and_print():
    path_free = load_group(Path(__file__).parents[2] / "ablations" / "rl_estimator.yaml")
    gdpo = path_free.rows[1].chain[1]
    assert gdpo == StageSpec("rl", "hsa", (("estimator", "gdpo"),)) and gdpo.name == "rl:hsa"
    assert str(gdpo) == 'rl:hsa[estimator="gdpo"]' and gdpo.label == "rl-hsa" and gdpo.harness == "hsa"
    assert path_free.differences[0]["minuend"] == "rl_estimator_gdpo"
