"""IFEval-style general-domain prompts at tiny scale, with rule-based responses and checkers.

Variant implemented and why:
- Records have exactly the shape of the official IFEval data (Zhou et al. 2023, "Instruction-Following
  Evaluation for Large Language Models", arXiv 2311.07911): `key`, `prompt`, `instruction_id_list`,
  `kwargs`, with the official instruction ids and kwarg names of `instructions_registry` (checked
  against `if-verifiable==0.1.2`), so the official checker scores them unchanged.
- Only the 12 ids a tiny model can learn (`INSTRUCTION_IDS`: case, commas, keywords, start/end phrases,
  bullet counts, word/sentence limits, repeat-prompt, postscript), combined 1-3 per prompt without the
  official `INSTRUCTION_CONFLICTS` (restricted to these ids) plus two of ours (`_EXTRA_CONFLICTS`).
- Base requests are short English templates over a topic pool; train and eval use disjoint topic
  pools (`TRAIN_TOPICS`, `EVAL_TOPICS`), so no prompt string is shared. None of the official 541
  prompts is used: the official data is for evaluation only.
- `general_response` writes a response that follows every instruction (the pretraining target of the
  tiny base and the on-policy-distillation sanity check); `general_prompts` only emits prompts for
  which it succeeds, and `check_instruction` (our small mirror of each official checker) verifies it.
- Used by on-policy distillation (train split) and by the in-domain IFEval-style suite (eval split).
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

INSTRUCTION_IDS: tuple[str, ...] = (
    "change_case:english_lowercase",
    "change_case:english_capital",
    "punctuation:no_comma",
    "keywords:existence",
    "keywords:forbidden_words",
    "startend:end_checker",
    "startend:quotation",
    "detectable_format:number_bullet_lists",
    "length_constraints:number_words",
    "length_constraints:number_sentences",
    "combination:repeat_prompt",
    "detectable_content:postscript",
)
# Official INSTRUCTION_CONFLICTS (after conflict_make) restricted to INSTRUCTION_IDS: repeat_prompt
# conflicts with all but keywords:existence and punctuation:no_comma; lowercase with capital.
_REPEAT_OK = {"keywords:existence", "punctuation:no_comma"}
_EXTRA_CONFLICTS = (  # ours: "P.S." confuses sentence counting; keep it out of sentence limits
    ("detectable_content:postscript", "length_constraints:number_sentences"),
)
RELATIONS: tuple[str, str] = ("less than", "at least")  # official _COMPARISON_RELATION
POSTSCRIPT_MARKERS: tuple[str, str] = ("P.S.", "P.P.S")  # official _POSTSCRIPT_MARKER
END_PHRASES: tuple[str, ...] = (  # the official _ENDING_OPTIONS first, then short phrases of ours
    "Any other questions?",
    "Is there anything else I can help with?",
    "Let me know if you have more questions.",
    "Hope this helps.",
    "That is all for now.",
    "Thanks for reading.",
    "Have a great day.",
    "See you next time.",
)
KEYWORDS: tuple[str, ...] = (
    "window", "river", "garden", "music", "morning", "sunlight", "notebook", "kitchen", "weekend",
    "mountain", "village", "basket", "candle", "blanket", "lantern", "harbor", "meadow", "pencil",
    "ribbon", "teacup", "compass", "puzzle", "orchard", "rainbow", "pillow", "bridge", "forest",
    "island", "umbrella", "whistle",
)  # fmt: skip
FORBIDDEN: tuple[str, ...] = (  # words the content sentences use, so avoiding them takes care
    "good", "simple", "easy", "people", "enjoy", "nice", "time", "fun", "calm", "small", "start",
    "help", "short", "little", "really",
)  # fmt: skip
TRAIN_TOPICS: tuple[str, ...] = (
    "baking bread", "walking in the park", "reading before bed", "keeping a journal", "riding a bike",
    "planting herbs", "learning to swim", "visiting a local market", "making tea", "cleaning the kitchen",
    "painting with watercolors", "playing chess", "going camping", "writing letters", "cooking soup",
    "watching the stars", "learning a new language", "taking photos", "playing the guitar",
    "growing tomatoes", "doing yoga", "running in the morning", "fixing a bicycle", "baking cookies",
    "visiting a museum", "hiking in the hills", "feeding birds", "knitting a scarf", "drawing with pencils",
    "studying for a test", "folding paper cranes", "building a birdhouse", "making pancakes",
    "organizing a closet", "walking a dog", "swimming in a lake", "cooking rice", "flying a kite",
    "picking apples", "sketching buildings", "listening to jazz", "reading comic books",
    "learning to juggle", "making a salad", "taking a nap", "washing a car", "planning a picnic",
    "sewing a button", "watering plants", "singing in a choir", "playing board games", "collecting stamps",
    "riding a train", "visiting a farm", "making lemonade", "building a sandcastle", "writing a poem",
    "learning to dance", "packing for a trip", "repairing a fence",
)  # fmt: skip
EVAL_TOPICS: tuple[str, ...] = (
    "brewing coffee", "climbing a wall", "baking a pie", "fishing at dawn", "painting a door",
    "learning to knit", "skating on ice", "visiting a zoo", "cooking pasta", "planting a tree",
    "reading poetry", "making soup", "sailing a small boat", "writing a diary", "playing the piano",
    "cleaning windows", "watching birds", "making bread rolls", "hiking by a river", "drawing maps",
    "carving wood", "learning to whistle", "making a kite", "visiting a library", "grilling vegetables",
    "keeping bees", "mending socks", "playing tennis", "sorting old photos", "cooking an omelet",
)  # fmt: skip
BASE_TEMPLATES: tuple[str, ...] = (
    "Write a short note about {t}.",
    "Describe {t} in a few sentences.",
    "Write a short paragraph about {t} for a friend.",
    "Tell me why {t} is worth trying.",
    "Give a brief description of {t}.",
    "Write a few tips about {t}.",
    "Explain how to get started with {t}.",
    "Write a short message to a friend about {t}.",
)
_CONTENT = (  # {t}: topic, {T}: topic capitalised. About 8-10 words each; some carry commas.
    "{T} is a good way to spend a free hour.",
    "Many people enjoy {t} because it feels calm.",
    "You do not need much to get started with {t}.",
    "A little patience makes {t} easier every week.",
    "{T} can turn an ordinary day into a nice one.",
    "It helps to start small and keep a steady pace.",
    "It is more fun to try {t} with a friend.",
    "The best part of {t} is how simple it can be.",
    "Try to set aside a few minutes for it each day.",
    "With practice {t} becomes a habit you look forward to.",
    "Some people find that {t} helps them relax.",
    "For most people, {t} takes only a little practice.",
    "If you are busy, a short session is still worth it.",
    "Begin with a plain plan and keep notes on what works.",
    "Mistakes are normal, so do not give up early.",
    "{T} is also a way to meet new friends.",
    "Good tools help, but a clear mind helps even more.",
    "Take a break whenever you feel tired.",
    "Over time, you will notice real progress.",
    "{T} is pleasant in every season.",
)
_KEYWORD_SENTENCES = ("It makes me think of a {a}.", "I picture a {a} when I think about it.")
_TWO_KEYWORD_SENTENCES = ("It makes me think of a {a} and a {b}.", "I picture a {a} next to a {b}.")
_BULLET_INTROS = ("Here are some points about {t}:", "A few points about {t}:", "Some thoughts on {t}:")
_POSTSCRIPTS = ("I hope this helps you with {t}.", "Let me know how it goes.", "Have fun and go slowly.")
_REPEAT_TEXT = (  # official RepeatPromptThenAnswer description
    "First repeat the request word for word without change, then give your answer (1. do not say any"
    " words or characters before repeating the request; 2. the request you need to repeat does not"
    " include this sentence)"
)
_KEY_BASE = {"train": 100_000, "eval": 900_000}


@dataclasses.dataclass(frozen=True)
class GeneralPrompt:
    """One prompt in the official IFEval record shape (keys as in google/IFEval `input_data.jsonl`).

    key: record id (int here; a Tulu prompt from `hub.py` keeps its string id). prompt: the full user
    message. instruction_id_list: official instruction ids. kwargs: one dict per id, official kwarg
    names, {} for ids without arguments.
    """

    key: int | str
    prompt: str
    instruction_id_list: list[str]
    kwargs: list[dict[str, Any]]

    def to_record(self) -> dict[str, Any]:
        """The record as a JSON-ready dict with the official keys, in the official order."""
        return {
            "key": self.key,
            "prompt": self.prompt,
            "instruction_id_list": list(self.instruction_id_list),
            "kwargs": [dict(k) for k in self.kwargs],
        }


def _conflicts(a: str, b: str) -> bool:
    """Whether two ids may not share a prompt (official conflicts on INSTRUCTION_IDS, plus ours)."""
    if a == b:
        return True
    if "combination:repeat_prompt" in (a, b):
        return (b if a == "combination:repeat_prompt" else a) not in _REPEAT_OK
    if {a, b} == {"change_case:english_lowercase", "change_case:english_capital"}:
        return True
    return any({a, b} == set(pair) for pair in _EXTRA_CONFLICTS)


# ---- checkers: each mirrors the official check_following of the class named in its comment ----
def _count_sentences(text: str) -> int:
    """Sentences ending in . ! or ? (a stand-in for the official nltk punkt count on our texts)."""
    pieces = re.split(r"(?<=[.!?])[\"']?\s+", text.strip())
    return sum(1 for p in pieces if re.search(r"\w", p))


def _count_words(text: str) -> int:
    """Official instructions_util.count_words: nltk RegexpTokenizer(r"\\w+") tokens."""
    return len(re.findall(r"\w+", text))


def _compare(value: int, relation: str, threshold: int) -> bool:
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    return value < threshold if relation == "less than" else value >= threshold


def _check_postscript(text: str, marker: str) -> bool:
    value = text.lower()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + marker.lower() + r".*$"
    return bool(re.findall(pattern, value, flags=re.MULTILINE))


_CHECKS: dict[str, Callable[..., bool]] = {
    # LowercaseLettersEnglishChecker: islower() and langdetect says "en" (ours: ASCII letters only)
    "change_case:english_lowercase": lambda r: r.islower() and not re.search(r"[^\x00-\x7f]", r),
    # CapitalLettersEnglishChecker: isupper() and langdetect says "en" (ours: ASCII letters only)
    "change_case:english_capital": lambda r: r.isupper() and not re.search(r"[^\x00-\x7f]", r),
    # CommaChecker
    "punctuation:no_comma": lambda r: not re.search(r"\,", r),
    # KeywordChecker (re.search, case-insensitive, no word boundaries)
    "keywords:existence": lambda r, keywords: all(re.search(k, r, flags=re.IGNORECASE) for k in keywords),
    # ForbiddenWords (\b word \b, case-insensitive)
    "keywords:forbidden_words": lambda r, forbidden_words: (
        not any(re.search(r"\b" + w + r"\b", r, flags=re.IGNORECASE) for w in forbidden_words)
    ),
    # EndChecker
    "startend:end_checker": lambda r, end_phrase: r.strip().strip('"').lower().endswith(end_phrase.strip().lower()),
    # QuotationChecker
    "startend:quotation": lambda r: len(r.strip()) > 1 and r.strip()[0] == '"' and r.strip()[-1] == '"',
    # BulletListChecker ("* " and "- " lines, exact count)
    "detectable_format:number_bullet_lists": lambda r, num_bullets: (
        len(re.findall(r"^\s*\*[^\*].*$", r, flags=re.MULTILINE)) + len(re.findall(r"^\s*-.*$", r, flags=re.MULTILINE))
        == num_bullets
    ),
    # NumberOfWords
    "length_constraints:number_words": lambda r, num_words, relation: _compare(_count_words(r), relation, num_words),
    # NumberOfSentences (official: nltk punkt; ours: _count_sentences)
    "length_constraints:number_sentences": lambda r, num_sentences, relation: _compare(
        _count_sentences(r), relation, num_sentences
    ),
    # RepeatPromptThenAnswer
    "combination:repeat_prompt": lambda r, prompt_to_repeat: (
        r.strip().lower().startswith(prompt_to_repeat.strip().lower())
    ),
    # PostscriptChecker
    "detectable_content:postscript": lambda r, postscript_marker: _check_postscript(r, postscript_marker),
}


def check_instruction(instruction_id: str, kwargs: Mapping[str, Any], response: str) -> bool:
    """Whether `response` follows one instruction (our mirror of the official checker for that id).

    Raises:
      KeyError: instruction_id is not one of INSTRUCTION_IDS.
      TypeError: kwargs lack an argument the id needs (or carry an unknown one).
    """
    if instruction_id not in _CHECKS:
        raise KeyError(f"instruction id {instruction_id!r} is not one of {INSTRUCTION_IDS}")
    return bool(_CHECKS[instruction_id](response, **kwargs))


def check_prompt(prompt: GeneralPrompt, response: str) -> list[bool]:
    """One bool per instruction of `prompt` (strict IFEval: the response as is)."""
    return [check_instruction(i, k, response) for i, k in zip(prompt.instruction_id_list, prompt.kwargs, strict=True)]


# ---- prompts ----
def _describe(instruction_id: str, kw: Mapping[str, Any], rng: random.Random) -> str:
    """The instruction's text: the official description pattern or one of our paraphrases."""
    options = {
        "change_case:english_lowercase": [
            "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed.",
            "Please answer in all lowercase letters.",
        ],
        "change_case:english_capital": [
            "Your entire response should be in English, and in all capital letters.",
            "Write your whole answer in capital letters.",
        ],
        "punctuation:no_comma": [
            "In your entire response, refrain from the use of any commas.",
            "Do not use any commas in your response.",
        ],
        "keywords:existence": [
            f"Include keywords {kw.get('keywords')} in the response.",
            "Make sure to use the words " + " and ".join(kw.get("keywords", [])) + ".",
        ],
        "keywords:forbidden_words": [
            f"Do not include keywords {kw.get('forbidden_words')} in the response.",
            "Do not use the words " + " or ".join(kw.get("forbidden_words", [])) + ".",
        ],
        "startend:end_checker": [
            f"Finish your response with this exact phrase {kw.get('end_phrase')}."
            " No other words should follow this phrase.",
            f'End your answer with the exact phrase "{kw.get("end_phrase")}"',
        ],
        "startend:quotation": [
            "Wrap your entire response with double quotation marks.",
            "Put your whole answer inside double quotes.",
        ],
        "detectable_format:number_bullet_lists": [
            f"Your answer must contain exactly {kw.get('num_bullets')} bullet points. Use the markdown bullet"
            " points such as:\n* This is point 1. \n* This is point 2",
            f'Use exactly {kw.get("num_bullets")} markdown bullet points (start each with "* ").',
        ],
        "length_constraints:number_words": [
            f"Answer with {kw.get('relation')} {kw.get('num_words')} words.",
            f"Your response should be {kw.get('relation')} {kw.get('num_words')} words long.",
        ],
        "length_constraints:number_sentences": [
            f"Your response should contain {kw.get('relation')} {kw.get('num_sentences')} sentences.",
            f"Write {kw.get('relation')} {kw.get('num_sentences')} sentences.",
        ],
        "detectable_content:postscript": [
            "At the end of your response, please explicitly add a postscript starting with "
            + str(kw.get("postscript_marker")),
            f"Add a postscript starting with {kw.get('postscript_marker')} at the end.",
        ],
    }
    return rng.choice(options[instruction_id])


def _sample_kwargs(instruction_id: str, topic: str, rng: random.Random) -> dict[str, Any]:
    """Official kwargs for one id, with values a short response can meet."""
    if instruction_id == "keywords:existence":
        return {"keywords": sorted(rng.sample(KEYWORDS, rng.choice((1, 1, 2))))}
    if instruction_id == "keywords:forbidden_words":
        return {
            "forbidden_words": sorted(rng.sample([w for w in FORBIDDEN if w not in topic.split()], rng.choice((1, 2))))
        }
    if instruction_id == "startend:end_checker":
        return {"end_phrase": rng.choice(END_PHRASES)}
    if instruction_id == "detectable_format:number_bullet_lists":
        return {"num_bullets": rng.randint(2, 4)}
    if instruction_id == "length_constraints:number_words":
        if rng.random() < 0.5:
            return {"relation": "less than", "num_words": rng.choice((30, 40, 50, 60, 80))}
        return {"relation": "at least", "num_words": rng.choice((10, 15, 20, 25, 30, 40))}
    if instruction_id == "length_constraints:number_sentences":
        if rng.random() < 0.5:
            return {"relation": "less than", "num_sentences": rng.randint(3, 7)}
        return {"relation": "at least", "num_sentences": rng.randint(2, 6)}
    if instruction_id == "detectable_content:postscript":
        return {"postscript_marker": rng.choice(POSTSCRIPT_MARKERS)}
    return {}  # ids without arguments; repeat_prompt is filled in by _build_prompt


def _build_prompt(key: int, topics: Sequence[str], rng: random.Random) -> GeneralPrompt:
    """One candidate prompt: a base request plus 1-3 non-conflicting instructions."""
    topic = rng.choice(topics)
    base = rng.choice(BASE_TEMPLATES).format(t=topic)
    count = rng.choices((1, 2, 3), weights=(0.45, 0.4, 0.15))[0]
    ids: list[str] = []
    while len(ids) < count:
        allowed = [i for i in INSTRUCTION_IDS if not any(_conflicts(i, j) for j in ids)]
        if not allowed:
            break
        ids.append(rng.choice(allowed))
    repeat = "combination:repeat_prompt" in ids
    ids = [i for i in ids if i != "combination:repeat_prompt"] + (["combination:repeat_prompt"] if repeat else [])
    kwargs = [_sample_kwargs(i, topic, rng) for i in ids]
    texts = [_describe(i, k, rng) for i, k in zip(ids, kwargs, strict=True) if i != "combination:repeat_prompt"]
    prompt = " ".join([base, *texts])
    if repeat:
        kwargs[-1] = {"prompt_to_repeat": prompt}
        prompt = prompt + "\n" + _REPEAT_TEXT
    return GeneralPrompt(key=key, prompt=prompt, instruction_id_list=ids, kwargs=kwargs)


def general_prompts(n: int, seed: int, split: str = "train") -> list[GeneralPrompt]:
    """`n` distinct IFEval-style prompts (IFEval, arXiv 2311.07911), deterministic per (seed, split).

    Args:
      n: number of prompts (>= 0).
      seed: sampling seed.
      split: "train" (TRAIN_TOPICS, keys from 100000) or "eval" (EVAL_TOPICS, keys from 900000);
        the topic pools are disjoint, so the splits share no prompt string.
    Returns:
      prompts, each one `general_response` can satisfy (checked when it is made).
    Raises:
      ValueError: unknown split, negative n, or n more than the split's distinct prompts allow.
    """
    if split not in _KEY_BASE:
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    topics = TRAIN_TOPICS if split == "train" else EVAL_TOPICS
    rng = random.Random(f"general-{split}-{seed}")
    out: list[GeneralPrompt] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise ValueError(f"could not make {n} distinct {split} prompts (made {len(out)})")
        cand = _build_prompt(_KEY_BASE[split] + len(out), topics, rng)
        if cand.prompt in seen:
            continue
        try:
            general_response(cand, random.Random(tries))
        except ValueError:
            continue
        seen.add(cand.prompt)
        out.append(cand)
    return out


# ---- responses ----
def prompt_topic(prompt: str) -> str:
    """The topic of a prompt made by `general_prompts` (read back from its base request)."""
    for template in BASE_TEMPLATES:
        head, _, tail = template.partition("{t}")
        match = re.match(re.escape(head) + r"(.+?)" + re.escape(tail), prompt)
        if match:
            return match.group(1)
    raise ValueError(f"prompt does not start with one of the base requests: {prompt[:60]!r}")


def _fill(template: str, topic: str, **extra: str) -> str:
    return template.format(t=topic, T=topic[:1].upper() + topic[1:], **extra)


def _assemble(prompt: GeneralPrompt, topic: str, n_sentences: int, rng: random.Random, short: bool) -> str:
    """One response attempt with n_sentences content sentences (plus bullets, keywords, ...).

    short: draw every sentence from the shortest candidates (for tight word limits).
    """
    kw = dict(zip(prompt.instruction_id_list, prompt.kwargs, strict=True))
    forbidden = kw.get("keywords:forbidden_words", {}).get("forbidden_words", [])

    def ok(text: str) -> bool:
        return not forbidden or _CHECKS["keywords:forbidden_words"](text, forbidden)

    def pick(templates: Sequence[str], k: int, **extra: str) -> list[str]:
        pool = [s for s in (_fill(t, topic, **extra) for t in templates) if ok(s)]
        if len(pool) < k:
            raise ValueError("not enough sentences avoid the forbidden words")
        if short:
            pool = sorted(pool, key=lambda x: (_count_words(x), x))[:k]
        return rng.sample(pool, k)

    n_bullets = kw.get("detectable_format:number_bullet_lists", {}).get("num_bullets", 0)
    content = pick(_CONTENT, n_sentences + n_bullets)
    lead, bullets = content[:n_sentences], content[n_sentences:]
    if "keywords:existence" in kw:
        words = kw["keywords:existence"]["keywords"]
        extra = {"a": words[0], "b": words[-1]}
        sentence = pick(_KEYWORD_SENTENCES if len(words) == 1 else _TWO_KEYWORD_SENTENCES, 1, **extra)[0]
        lead.insert(rng.randint(0, len(lead)), sentence)
    blocks = [" ".join(lead)] if lead else []
    if bullets:
        blocks.append("\n".join([pick(_BULLET_INTROS, 1)[0], *("* " + b for b in bullets)]))
    if "detectable_content:postscript" in kw:
        blocks.append(kw["detectable_content:postscript"]["postscript_marker"] + " " + pick(_POSTSCRIPTS, 1)[0])
    text = "\n\n".join(blocks)
    if "startend:end_checker" in kw:
        text = text + ("\n\n" if bullets and "detectable_content:postscript" not in kw else " ")
        text += kw["startend:end_checker"]["end_phrase"]
    if "punctuation:no_comma" in kw:
        text = text.replace(",", "")
    if "change_case:english_lowercase" in kw:
        text = text.lower()
    if "change_case:english_capital" in kw:
        text = text.upper()
    if "startend:quotation" in kw:
        text = f'"{text}"'
    if "combination:repeat_prompt" in kw:
        text = kw["combination:repeat_prompt"]["prompt_to_repeat"] + "\n\n" + text
    return text


def general_response(prompt: GeneralPrompt, rng: random.Random) -> str:
    """A rule-based response that follows every instruction of a `general_prompts` prompt.

    Builds a few topic sentences (plus bullet list, keyword sentence, postscript, end phrase as the
    instructions ask), applies case/comma/quotation/repeat rules, and returns the first attempt that
    passes `check_prompt` on every instruction: 20 random attempts, then the shortest responses of
    0..11 sentences (nearly independent of rng, so a prompt that passed once passes again), then
    longer ones.

    Args:
      prompt: a prompt made by `general_prompts` (its base request names the topic).
      rng: the random source (which sentences, how many).
    Returns:
      the response text.
    Raises:
      ValueError: the prompt was not made by `general_prompts`, or no attempt satisfies all its
        instructions (e.g. a word limit too small for the bullets it also asks for).
    """
    topic = prompt_topic(prompt.prompt)
    low = 3 if any(i.startswith("change_case:") for i in prompt.instruction_id_list) else 1  # langdetect needs text
    plans = [(rng.randint(low, 5), False) for _ in range(20)] + [(k, True) for k in range(12)]
    for n_sentences, short in plans + [(k, False) for k in range(6, 16)]:
        try:
            text = _assemble(prompt, topic, n_sentences, rng, short)
        except ValueError:
            continue
        if text.strip() and all(check_prompt(prompt, text)):
            return text
    raise ValueError(f"no response satisfies all instructions of prompt {prompt.key}: {prompt.instruction_id_list}")
