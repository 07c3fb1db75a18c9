"""What a suite's episodes did, counted by how each ended: answered, abstained (with or without the answer in its
context), inaccurate, cut; with the call statuses, the refusals and a few episodes of each kind to read.

An average hides how it was earned: a model whose Accuracy rises because it states nothing looks like one that
learned to answer. `episode_kind` sorts every episode of a `<suite>.jsonl` (the evaluation's per-item records,
`hat_jax.eval.live.run_live_suite`) into one of `KINDS`, judged from the stored episode alone with the rule judges
(`hat_jax.judges.rules`: Accuracy, the checkable and the returned gold facts), first match wins:

- cut: the episode has no valid reply (outcome malformed, round_limit or truncated);
- inaccurate: Accuracy 0 (a wrong or ungrounded fact, a false promise, ...);
- answered: accurate, and the reply states a checkable gold fact of its task;
- abstained_fetched: accurate, states no gold fact, and an ok world-tool result held one (the answer was in its
  context and it did not give it);
- abstained: accurate, states no gold fact, and no tool returned one;
- no_fact_asked: accurate, and the task has no checkable gold fact (identity, chit-chat, off-topic, injection).

abstained_fetched + abstained over the episodes with a checkable fact is the suite's `abstained` reading metric
(`hat_jax.judges.reading`). Not a metric of the HAT report: a reading aid, printed by `experiments/episodes.py`.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hat_jax.judges import phrases, rules
from hat_jax.judges.reading import RATIO_TERMS, fact_reading, ratio_of_sums
from hat_jax.judges.rules import CUT_OUTCOMES
from hat_jax.sim.types import Episode, episode_from_dict

KINDS: tuple[str, ...] = ("answered", "abstained_fetched", "abstained", "no_fact_asked", "inaccurate", "cut")
KIND_TEXT: dict[str, str] = {
    "answered": "accurate, states a gold fact",
    "abstained_fetched": "accurate, states no gold fact although a tool returned one",
    "abstained": "accurate, states no gold fact, none returned",
    "no_fact_asked": "accurate, the task asks no checkable fact",
    "inaccurate": "Accuracy 0",
    "cut": "no valid reply (malformed, round limit or truncated)",
}


def episode_kind(episode: Episode) -> str:
    """The kind (one of `KINDS`, module docstring) of `episode`; the abstaining kinds are the episodes that
    `hat_jax.judges.reading.fact_reading` counts as abstained."""
    if episode.outcome in CUT_OUTCOMES:
        return "cut"
    if rules.accuracy(episode).value != 1:
        return "inaccurate"
    fetched, _, abstained = fact_reading(episode)
    if fetched is None:
        return "no_fact_asked"
    if not abstained:
        return "answered"
    return "abstained_fetched" if fetched else "abstained"


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a `<suite>.jsonl` file, one dict per line.

    Raises:
      FileNotFoundError: no such file. ValueError: a file that is not UTF-8 (naming it), a line that is not JSON
        or has no "episode" (naming the line).
    """
    out = []
    with open(path, encoding="utf-8") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not a JSON line ({e})") from None
        if not isinstance(record, Mapping) or "episode" not in record:
            raise ValueError(f"{path}:{n}: expected an evaluation record with an 'episode' field")
        out.append(record)
    return out


def breakdown(episodes: Sequence[Episode], kinds: Sequence[str] | None = None) -> dict[str, Any]:
    """Counts of `episodes`: {"episodes": n, "kinds": {kind: count} in `KINDS` order, "refusals": replies that
    refuse (`phrases.refuses`) a task with a checkable gold fact (an answerable question), "no_call": episodes
    without a tool call, "calls": {status: count}, most first}. `kinds`: the episodes' `episode_kind`s when the
    caller has them already."""
    kinds = collections.Counter(kinds if kinds is not None else map(episode_kind, episodes))
    statuses = collections.Counter(c.status for e in episodes for c in e.tool_calls)
    return {"episodes": len(episodes), "kinds": {k: kinds.get(k, 0) for k in KINDS},
            "refusals": sum(e.outcome not in CUT_OUTCOMES and phrases.refuses(e.reply)
                            and bool(rules.checkable_facts(e)) for e in episodes),
            "no_call": sum(not e.tool_calls for e in episodes), "calls": dict(statuses.most_common())}


def _clip(text: str, width: int) -> str:
    """`text` on one line, at most `width` characters (an ellipsis last when cut), its pipes escaped for a
    markdown cell (`<|im_end|>` reads as written)."""
    text = " ".join(str(text).split())
    text = text if len(text) <= width else text[: width - 1] + "…"
    return text.replace("|", "\\|")


def reply_text(episode: Episode, turn_texts: Sequence[str] = ()) -> str:
    """The reply as the breakdown shows it: "(empty)" for none; a cut episode's outcome in front and, when
    `turn_texts` (the record's decoded model turns) are given, its last turn as the model wrote it, since a cut
    episode has no parsed reply to show."""
    text = episode.reply.strip() or "(empty)"
    if episode.outcome not in CUT_OUTCOMES:
        return text
    if turn_texts and not episode.reply.strip():
        text = f"last turn: {turn_texts[-1].strip() or '(empty)'}"
    return f"({episode.outcome}) {text}"


def _calls_text(episode: Episode, width: int) -> str:
    parts = [f"{c.name}({json.dumps(c.arguments, ensure_ascii=False) if c.arguments else ''}) -> {c.status}"
             for c in episode.tool_calls]
    return _clip("; ".join(parts) or "(none)", width)


def breakdown_markdown(title: str, episodes: Sequence[Episode], show: int = 2, width: int = 100,
                       turn_texts: Sequence[Sequence[str]] | None = None) -> str:
    """A markdown section: `breakdown` of `episodes` as a table of kinds with their shares, the call statuses, and
    the first `show` episodes of each kind (viewer message, calls, reply, each clipped to `width` characters).
    `turn_texts`: each episode's decoded model turns (`suite_records`), shown for a cut episode (`reply_text`).

    Raises:
      ValueError: no episodes, `show` < 0, or `turn_texts` not one per episode.
    """
    if not episodes:
        raise ValueError(f"{title}: no episodes")
    if show < 0:
        raise ValueError(f"show = {show}; expected >= 0")
    if turn_texts is not None and len(turn_texts) != len(episodes):
        raise ValueError(f"{title}: {len(turn_texts)} turn_texts for {len(episodes)} episodes")
    turns = turn_texts if turn_texts is not None else [()] * len(episodes)
    kinds = [episode_kind(e) for e in episodes]
    b = breakdown(episodes, kinds)
    n = b["episodes"]
    calls = ", ".join(f"{s} {c}" for s, c in b["calls"].items()) or "none"
    lines = [f"## {title}", "", f"{n} episodes; {b['no_call']} without a tool call; calls by status: {calls}; "
             f"{b['refusals']} replies refuse an answerable question.", "",
             "| kind | episodes | share | what |", "|---|---|---|---|"]
    lines += [f"| {k} | {c} | {100.0 * c / n:.0f}% | {KIND_TEXT[k]} |" for k, c in b["kinds"].items()]
    if show:
        by_kind: dict[str, list[tuple[Episode, Sequence[str]]]] = collections.defaultdict(list)
        for e, kind, t in zip(episodes, kinds, turns):
            by_kind[kind].append((e, t))
        lines += ["", "| kind | viewer | calls | reply |", "|---|---|---|---|"]
        for kind in KINDS:
            for e, t in by_kind[kind][:show]:
                lines.append(f"| {kind} | {_clip(e.task.message, 40)} | {_calls_text(e, width)} | "
                             f"{_clip(reply_text(e, t), width)} |")
    return "\n".join(lines) + "\n"


PERTURBATION_KEYS: tuple[str, ...] = ("name_valid", "chain_done", "calls_per_ep")


def perturbation_reading(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """The reading metrics of a suite's records split by the item's perturbation (Tool robustness: tool_failure,
    schema_variant, distractor_tools): {perturbation: {"episodes": n, "calls": calls, key: value or None for
    `PERTURBATION_KEYS`}}, in first-seen order; the values as `hat_jax.judges.reading.reading_scores` computes them
    (`ratio_of_sums`). schema_variant renames the tools with HSA's training families, so its name_valid is reading
    a renamed harness of the kind HSA trains on. None when some record lacks its perturbation or its reading
    counts (records written before they existed)."""
    fields = {f for key in PERTURBATION_KEYS for f in RATIO_TERMS[key][0]}
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        item, reading = record.get("item"), record.get("reading")
        if not (isinstance(item, Mapping) and isinstance(item.get("perturbation"), str)
                and isinstance(reading, Mapping) and fields <= reading.keys()):
            return None
        groups.setdefault(item["perturbation"], []).append(reading)
    out = {}
    for perturbation, readings in groups.items():
        out[perturbation] = {"episodes": len(readings), "calls": sum(int(r["calls"]) for r in readings),
                             **{key: ratio_of_sums(key, readings) for key in PERTURBATION_KEYS}}
    return out


def perturbation_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """`perturbation_reading` of `records` as a markdown table; "" when the suite has one perturbation or the
    records hold no reading counts."""
    rows = perturbation_reading(records)
    if not rows or len(rows) < 2:
        return ""

    def fmt(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = ["| perturbation | episodes | calls | name validity | gold chain done | calls / episode |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {p} | {r['episodes']} | {r['calls']} | {fmt(r['name_valid'])} | {fmt(r['chain_done'])} | "
              f"{fmt(r['calls_per_ep'], 2)} |" for p, r in rows.items()]
    return "\n".join(lines) + "\n"


def suite_files(path: str | Path, suites: Iterable[str]) -> list[Path]:
    """The `<suite>.jsonl` files of an experiment: `path` is a row's folder (`runs/<experiment>`, whose
    results.json names its evaluation folders, "eval_dirs") or any folder, searched recursively.

    Raises:
      FileNotFoundError: `path` is not a folder, or holds none of the suites' files.
    """
    path = Path(path).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a folder (expected runs/<experiment> or an evaluation folder)")
    roots = [path]
    results = path / "results.json"
    old_row = False
    if results.is_file():
        try:
            data = json.loads(results.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"{results}: not JSON ({e})") from None
        dirs = data.get("eval_dirs") if isinstance(data, Mapping) else None
        if dirs is not None and not (isinstance(dirs, list) and all(isinstance(d, str) and d for d in dirs)):
            raise ValueError(f"{results}: eval_dirs = {dirs!r}; expected a list of folder paths")
        if dirs:
            roots = [path.parent / d for d in dirs]  # relative to the output root, the row folder's parent
        old_row = not dirs
    suites = tuple(dict.fromkeys(suites))
    files = sorted(f for root in roots for s in suites for f in root.rglob(f"{s}.jsonl") if f.is_file())
    if not files:
        hint = ""
        if roots != [path]:
            hint = f" (its results.json's eval_dirs: {', '.join(map(str, roots))})"
        elif old_row:
            hint = " (its results.json predates eval_dirs: pass the evaluation folder, DIR/evals/<key>/seed<k>/...)"
        raise FileNotFoundError(f"{path}: no {', '.join(f'{s}.jsonl' for s in suites)} below it{hint}")
    return files


def suite_records(path: str | Path) -> tuple[list[Episode], list[list[str]]]:
    """(episodes, turn_texts) of one `<suite>.jsonl` file: `read_records` then `records_episodes`.

    Raises:
      FileNotFoundError, ValueError: see `read_records` and `records_episodes`.
    """
    return records_episodes(read_records(path), path)


def records_episodes(records: Sequence[Mapping[str, Any]], source: str | Path) -> tuple[list[Episode], list[list[str]]]:
    """(episodes, turn_texts) of a suite file's records (`read_records`, `episode_from_dict`): the stored episodes
    and each one's decoded model turns (the record's "turn_texts"; [] where a record has none). `source` names
    the file in errors.

    Raises:
      ValueError: a record whose episode cannot be rebuilt, or whose turn_texts is not a list of strings, naming
        `source` and the record.
    """
    episodes, turns = [], []
    for n, record in enumerate(records, 1):
        try:
            episodes.append(episode_from_dict(record["episode"]))
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"{source}: record {n}: not a stored episode ({type(e).__name__}: {e})") from None
        texts = record.get("turn_texts", [])
        if not (isinstance(texts, list) and all(isinstance(t, str) for t in texts)):
            raise ValueError(f"{source}: record {n}: turn_texts = {texts!r:.60}; expected a list of strings")
        turns.append(texts)
    return episodes, turns


def episodes_of(path: str | Path) -> list[Episode]:
    """The stored episodes of one `<suite>.jsonl` file (`suite_records` without the turn texts).

    Raises:
      ValueError: see `suite_records`.
    """
    return suite_records(path)[0]
