"""The ablation declarations: the repository's tables load, and malformed files are named errors."""

from pathlib import Path

import pytest

from hat_jax.experiments.declarations import DeclarationError, StageSpec, load_all, load_group, parse_stage, resolve


def test_repository_tables_load_with_the_paper_rows():
    groups = load_all()
    assert set(groups) == {"table3", "table4", "table5", "table6"}
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
     "paper: {live_qa.avgg: 1}}\n", r"rows\[0\]\.paper\.live_qa\.avgg: unknown metric path; did you mean \['live_qa.avg'"),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: other_a, description: d, chain: []}\n",
     r"rows\[0\]\.name: 'other_a' must start with the group name 't9_'"),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: t9_a, chain: []}\n",
     r"rows\[0\]: missing field 'description'"),
    ("group: t9\ntitle: x\ncolumns: [live_qa.avg]\nrows:\n  - {name: t9_a, description: d, chain: ['sft:x']}\n",
     r"rows\[0\]\.chain\[0\]: unknown stage 'sft:x'"),
    ("group: t9\ntitle: x\ncolumns: live_qa.avg\nrows: []\n", r"columns: expected list, got str"),
    ("group: [t9\n", "cannot read the declaration"),
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
