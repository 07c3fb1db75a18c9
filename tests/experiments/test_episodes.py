"""The episode breakdown: each kind on a hand-made episode, the counts and table of a suite file, the row folder's
evaluation folders, the CLI, and bad input."""

import dataclasses
import json

import pytest

from hat_jax.experiments.episodes import (KINDS, breakdown, breakdown_markdown, episode_kind, episodes_of,
                                          perturbation_markdown, perturbation_reading, read_records, suite_files,
                                          suite_records)
from hat_jax.judges.reading import episode_reading
from hat_jax.harness.state import HarnessState, Tool
from hat_jax.sim.types import Episode, Task, ToolCallRecord, episode_to_dict

TASK = Task(task_id="t-1", seed=0, intent="price", message="这条裙子多少钱？", skill_key="price_promotion",
            product_ids=("P1",), gold_calls=((("get_price", {"product_id": "P1"}),),), gold_facts={"live_price": 199.0})
IDENTITY = Task(task_id="t-2", seed=0, intent="identity", message="你是真人吗", skill_key="identity_compliance",
                product_ids=(), gold_calls=(), gold_facts={}, behaviour="disclose_ai")
PRICE = ToolCallRecord(round=1, name="jiage", impl="get_price", arguments={"product_id": "P1"},
                       canonical_args={"product_id": "P1"}, status="ok", result={"live_price": 199.0})
UNKNOWN = ToolCallRecord(round=1, name="price_x", impl="", arguments={"product_id": "P1"}, canonical_args={},
                         status="unknown_tool", result={})
HARNESS = HarnessState("t", "t-1", "load", (), (Tool("jiage", "价格", {"type": "object", "properties": {}},
                                                     "get_price"),), ())


def ep(reply: str, calls=(PRICE,), task: Task = TASK, outcome: str = "replied") -> Episode:
    return Episode(task=task, harness_version="t-1", messages=({"role": "user", "content": task.message},),
                   tool_calls=tuple(calls), reply=reply, outcome=outcome)


EPISODES = {
    "answered": ep("直播间到手价199元哦"),
    "abstained_fetched": ep("这个问题我无法回答哦，欢迎继续在直播间提问"),
    "abstained": ep("宝宝稍等，欢迎继续在直播间提问", calls=(UNKNOWN,)),
    "no_fact_asked": ep("我是AI主播哦", calls=(), task=IDENTITY),
    "inaccurate": ep("直播间到手价99元哦"),
    "cut": ep("", outcome="malformed"),
}


def test_each_kind_and_its_agreement_with_the_reading_metric():
    for kind, e in EPISODES.items():
        assert episode_kind(e) == kind, kind
        # The two abstaining kinds are exactly the reading metric's abstentions
        assert (episode_reading(e, HARNESS).abstained == 1) == kind.startswith("abstained"), kind
    assert tuple(EPISODES) == KINDS


def test_breakdown_counts_and_markdown(tmp_path):
    episodes = [*EPISODES.values(), EPISODES["answered"]]
    b = breakdown(episodes)
    assert b == {"episodes": 7, "kinds": {"answered": 2, "abstained_fetched": 1, "abstained": 1, "no_fact_asked": 1,
                                          "inaccurate": 1, "cut": 1},
                 "refusals": 1, "no_call": 1, "calls": {"ok": 5, "unknown_tool": 1}}
    md = breakdown_markdown("live_qa", episodes, show=1, width=60)
    assert "7 episodes; 1 without a tool call; calls by status: ok 5, unknown_tool 1; 1 replies refuse" in md
    assert "| answered | 2 | 29% | accurate, states a gold fact |" in md
    assert ('| abstained | 这条裙子多少钱？ | price_x({"product_id": "P1"}) -> unknown_tool | '
            '宝宝稍等，欢迎继续在直播间提问 |') in md
    assert "| cut | 这条裙子多少钱？ | jiage" in md and "| (malformed) (empty) |" in md
    assert md.count("| answered | 这条裙子") == 1  # show=1
    clipped = breakdown_markdown("live_qa", [EPISODES["abstained"]], width=20)
    # 20 characters, the last an ellipsis
    assert "| price_x({\"product_i… | 宝宝稍等，欢迎继续在直播间提问 |" in clipped
    assert "| kind | viewer |" not in breakdown_markdown("live_qa", episodes, show=0)
    with pytest.raises(ValueError, match="no episodes"):
        breakdown_markdown("live_qa", [])
    with pytest.raises(ValueError, match="show = -1"):
        breakdown_markdown("live_qa", episodes, show=-1)
    # A cut episode has no parsed reply: given the record's turn texts, its last turn is shown as written
    turns = [["ok"]] * 5 + [["<tool_call>", '<tool_call>\n<function=jiage>\n<parameter=product_'], ["ok"]]
    md = breakdown_markdown("live_qa", episodes, turn_texts=turns)
    assert "| (malformed) last turn: <tool_call> <function=jiage> <parameter=product_ |" in md
    assert "| 直播间到手价199元哦 |" in md                       # a parsed reply is shown, not its turn text
    with pytest.raises(ValueError, match="1 turn_texts for 7 episodes"):
        breakdown_markdown("live_qa", episodes, turn_texts=[["x"]])


def test_reading_by_perturbation_matches_reading_scores_per_group():
    from hat_jax.judges.reading import reading_scores

    groups = {"tool_failure": [ep("x"), ep("y", calls=(PRICE, UNKNOWN))],
              "schema_variant": [ep("z", calls=(UNKNOWN, UNKNOWN, UNKNOWN)), ep("w", calls=(), task=IDENTITY)],
              "distractor_tools": [ep("v", calls=())]}
    records = [{"item": {"perturbation": p}, "reading": dataclasses.asdict(episode_reading(e, HARNESS))}
               for p, eps in groups.items() for e in eps]
    rows = perturbation_reading(records)
    assert list(rows) == list(groups)
    for p, eps in groups.items():
        want = reading_scores([episode_reading(e, HARNESS) for e in eps])
        assert rows[p] == {"episodes": len(eps), "calls": sum(len(e.tool_calls) for e in eps),
                           **{k: want[k] for k in ("name_valid", "chain_done", "calls_per_ep")}}
    # tool_failure: 2 of 3 calls valid; schema_variant: none of 3, and the identity task has no gold call
    assert rows["tool_failure"]["name_valid"] == pytest.approx(200 / 3) and rows["schema_variant"]["name_valid"] == 0
    assert rows["distractor_tools"]["name_valid"] is None and rows["schema_variant"]["chain_done"] == 0
    md = perturbation_markdown(records)
    assert "| schema_variant | 2 | 3 | 0.0 | 0.0 | 1.50 |" in md and "| distractor_tools | 1 | 0 | - | 0.0 | 0.00 |" in md
    # One perturbation (Live QA), or records without reading counts: no table
    assert perturbation_markdown([{**r, "item": {"perturbation": "none"}} for r in records]) == ""
    assert perturbation_reading([{"item": {"perturbation": "none"}, "episode": {}}]) is None
    assert perturbation_markdown([{"item": {}, "reading": records[0]["reading"]}]) == ""


def _write_suite(folder, episodes):
    folder.mkdir(parents=True)
    lines = [json.dumps({"item": i, "episode": episode_to_dict(e)}, ensure_ascii=False) for i, e in enumerate(episodes)]
    (folder / "live_qa.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_row_folder_finds_its_evaluations_and_the_cli_prints_them(tmp_path, capsys, monkeypatch):
    from experiments.episodes import main

    seed_dir = tmp_path / "evals" / "key" / "seed0" / "ek"
    _write_suite(seed_dir, list(EPISODES.values()))
    _write_suite(tmp_path / "evals" / "other" / "seed0" / "ek", [EPISODES["cut"]])  # another row's evaluation
    row = tmp_path / "table6_both"
    row.mkdir()
    (row / "results.json").write_text(json.dumps({"eval_dirs": ["evals/key/seed0/ek"]}))
    assert suite_files(row, ["live_qa"]) == [seed_dir / "live_qa.jsonl"]
    assert [episode_kind(e) for e in episodes_of(seed_dir / "live_qa.jsonl")] == list(KINDS)
    assert len(suite_files(tmp_path / "evals", ["live_qa"])) == 2  # any folder: searched recursively
    assert main([str(row), "--suite", "live_qa", "--show", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"## {seed_dir / 'live_qa.jsonl'}") and "| abstained_fetched | 1 | 17% |" in out
    # Nothing to read: a clear error and exit status 2
    assert main([str(row), "--suite", "variant_qa"]) == 2
    assert "no variant_qa.jsonl below it (its results.json's eval_dirs:" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2
    assert "not a folder" in capsys.readouterr().err
    # A good live_qa beside a bad variant_qa: nothing is printed before the error that names the bad file
    (seed_dir / "variant_qa.jsonl").write_text("not json\n", encoding="utf-8")
    assert main([str(row), "--suite", "live_qa", "--suite", "variant_qa"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "variant_qa.jsonl:1: not a JSON line" in printed.err
    (seed_dir / "variant_qa.jsonl").unlink()
    # The row folder given as "." (its parent is then the output root); a repeated suite is read once
    monkeypatch.chdir(row)
    assert suite_files(".", ["live_qa", "live_qa"]) == [seed_dir / "live_qa.jsonl"]
    # A row written before eval_dirs: the error says where to look instead; a malformed eval_dirs is refused
    (row / "results.json").write_text(json.dumps({"experiment": "table6_both"}))
    with pytest.raises(FileNotFoundError, match="predates eval_dirs: pass the evaluation folder"):
        suite_files(row, ["live_qa"])
    (row / "results.json").write_text(json.dumps({"eval_dirs": "evals/key"}))
    with pytest.raises(ValueError, match="eval_dirs = 'evals/key'; expected a list of folder paths"):
        suite_files(row, ["live_qa"])


def test_bad_lines_name_the_file_and_line(tmp_path):
    f = tmp_path / "live_qa.jsonl"
    f.write_text('{"item": 0, "episode": {}}\nnot json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"live_qa.jsonl:2: not a JSON line"):
        read_records(f)
    f.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(ValueError, match=r"live_qa.jsonl: not UTF-8 text \('utf-8' codec can't decode byte 0xff"):
        read_records(f)
    f.write_text('{"item": 0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"live_qa.jsonl:1: expected an evaluation record with an 'episode' field"):
        read_records(f)
    f.write_text('{"item": 0, "episode": {}}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"live_qa.jsonl: record 1: not a stored episode \(ValueError: episode record"):
        episodes_of(f)
    good = json.dumps({"item": 0, "episode": episode_to_dict(EPISODES["cut"]), "turn_texts": ["<tool_call>"]})
    f.write_text(good + "\n" + json.dumps({"item": 1, "episode": episode_to_dict(EPISODES["cut"])}) + "\n",
                 encoding="utf-8")
    assert suite_records(f)[1] == [["<tool_call>"], []]              # a record without turn_texts: []
    f.write_text(json.dumps({"item": 0, "episode": episode_to_dict(EPISODES["cut"]), "turn_texts": "x"}) + "\n",
                 encoding="utf-8")
    with pytest.raises(ValueError, match=r"live_qa.jsonl: record 1: turn_texts = 'x'; expected a list of strings"):
        suite_records(f)
