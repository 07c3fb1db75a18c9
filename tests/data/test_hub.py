"""Tulu prompt loader: a local fixture in Tulu's schema through the datasets path; the hub offline."""

import json

import datasets
import pytest

from hat_jax.data.hub import TULU_SOURCE, HubDataError, first_user_turn, load_tulu_prompts


def _rows():
    """10 rows in Tulu 3 SFT mixture's schema; rows 3 (no user turn) and 7 (empty user turn) are unusable."""
    rows = []
    for i in range(10):
        messages = [{"role": "system", "content": "You are helpful."}] if i % 2 else []
        if i == 3:
            messages.append({"role": "assistant", "content": "no user here"})
        else:
            messages.append({"role": "user", "content": "" if i == 7 else f"Question number {i}?"})
            messages.append({"role": "assistant", "content": f"Answer {i}."})
            messages.append({"role": "user", "content": "A follow-up."})
        rows.append({"id": f"fixture_{i}", "messages": messages, "source": "hat-jax/fixture"})
    return rows


@pytest.fixture(scope="module")
def tulu_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tulu") / "data"
    folder.mkdir()
    datasets.Dataset.from_list(_rows()).to_parquet(str(folder / "train-00000.parquet"))
    return folder


def test_first_user_turn():
    assert first_user_turn([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]) == "q"
    assert first_user_turn([{"role": "assistant", "content": "a"}]) is None
    assert first_user_turn([{"role": "user", "content": "  "}]) is None


def test_local_parquet_folder_loads_first_user_turns(tulu_dir, tmp_path):
    got = load_tulu_prompts(5, seed=0, source=tulu_dir, streaming=False, cache_dir=tmp_path)
    assert len(got) == 5
    for p in got:
        i = int(p.key.split("_")[1])
        assert p.prompt == f"Question number {i}?" and i not in (3, 7)
        assert p.instruction_id_list == [] and p.kwargs == []
    assert load_tulu_prompts(5, seed=0, source=tulu_dir, streaming=False, cache_dir=tmp_path) == got
    every = load_tulu_prompts(100, seed=0, source=tulu_dir, streaming=False, cache_dir=tmp_path)
    assert sorted(p.key for p in every) == [f"fixture_{i}" for i in range(10) if i not in (3, 7)]
    other = load_tulu_prompts(100, seed=1, source=tulu_dir, streaming=False, cache_dir=tmp_path)
    assert [p.key for p in other] != [p.key for p in every]  # the seed changes the order


def test_streaming_reads_the_same_rows_deterministically(tulu_dir):
    # each streamed read waits datasets' SLEEP_TIME_ON_THREADS_SHUTDOWN (5 s): two reads only
    first = load_tulu_prompts(100, seed=0, source=tulu_dir, streaming=True)
    assert sorted(p.key for p in first) == [f"fixture_{i}" for i in range(10) if i not in (3, 7)]
    assert load_tulu_prompts(100, seed=0, source=tulu_dir, streaming=True) == first


def test_local_jsonl_file_goes_through_the_same_path(tmp_path):
    path = tmp_path / "tulu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows()), encoding="utf-8")
    got = load_tulu_prompts(3, seed=0, source=path, streaming=False, cache_dir=tmp_path / "cache")
    assert len(got) == 3 and all(p.prompt.startswith("Question number") for p in got)


def test_hub_offline_names_the_dataset_and_asks_for_a_local_path():
    if not datasets.config.HF_HUB_OFFLINE:
        pytest.skip("network allowed: the hub path would download")
    with pytest.raises(HubDataError, match="local path") as err:
        load_tulu_prompts(3, seed=0)
    assert TULU_SOURCE in str(err.value)


def test_bad_local_data(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(HubDataError, match="no .parquet"):
        load_tulu_prompts(1, 0, source=empty)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    datasets.Dataset.from_list([{"id": "a", "text": "no messages"}]).to_parquet(str(wrong / "x.parquet"))
    with pytest.raises(HubDataError, match="'messages' column"):
        load_tulu_prompts(1, 0, source=wrong, streaming=False, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="n must be"):
        load_tulu_prompts(-1, 0, source=wrong)
