"""Recipe "add an HSA transform": a toy transform registered here is picked up by `HSAConfig`, `compose`
and the SFT data pipeline, through the public registry only (hat_jax.harness.hsa)."""

import dataclasses
import random

import pytest

from hat_jax.data.pipeline import SFTDataConfig, hsa_dataset, transform_shares
from hat_jax.harness import hsa
from hat_jax.harness.render import render_system_prompt

NAME = "mark_section_titles"


@pytest.fixture
def toy_transform():
    """Registers the toy transform for one test and removes it afterwards (the registry is process-wide)."""

    @hsa.hsa_transform(heldout="none")
    def mark_section_titles(h, rng, *, mark: str = "*"):
        """Appends `mark` to every prompt section title (the task and the bindings are untouched)."""
        sections = tuple(dataclasses.replace(s, title=s.title + mark) for s in h.sections)
        return h.replace(sections=sections), hsa.NameMap()

    try:
        yield hsa.HSA_TRANSFORMS[NAME]
    finally:
        del hsa.HSA_TRANSFORMS[NAME]


def test_the_toy_transform_is_registered_with_its_parameters(toy_transform):
    assert hsa.transform_names()[-1] == NAME and NAME not in hsa.heldout_forced()
    assert (toy_transform.heldout, dict(toy_transform.params)) == ("none", {"mark": "*"})
    assert NAME in hsa.HSAConfig().allowed


def test_compose_applies_the_toy_transform_with_its_configured_parameter(toy_transform, harness):
    only = hsa.HSAConfig(probs={NAME: 1.0}, default_p=0.0, params={NAME: {"mark": "★"}})
    new, name_map, applied = hsa.compose(harness, random.Random(0), only)
    assert applied == (NAME,) and name_map == hsa.NameMap()
    assert [s.title for s in new.sections] == [s.title + "★" for s in harness.sections]
    assert new.tools == harness.tools and new.skills == harness.skills
    assert new.family == "hsa-train" and new.version.startswith(harness.version + "+hsa.")
    for s in harness.sections:
        assert s.title + "★" in render_system_prompt(new)


def test_the_sft_pipeline_flags_and_applies_the_toy_transform(toy_transform, harness):
    record = {"messages": [{"role": "system", "content": "old"}, {"role": "user", "content": "多少钱？"},
                           {"role": "assistant", "content": "稍等。", "reasoning_content": ""}],
              "task_id": "live-000001", "harness_id": "production", "seed": 7}
    only = hsa.HSAConfig(probs={NAME: 1.0}, default_p=0.0)
    config = SFTDataConfig(p_hsa=1.0, hsa=only, shuffle=False)
    element = next(iter(hsa_dataset([record], {"production": harness}, config)))
    assert element["hsa_applied"].tolist() == [0] * (len(hsa.transform_names()) - 1) + [1]
    assert element["messages"][0]["content"] == render_system_prompt(element["harness"])
    assert [s.title for s in element["harness"].sections] == [s.title + "*" for s in harness.sections]
    assert transform_shares([record], {"production": harness}, config) == {
        **dict.fromkeys(hsa.transform_names(), 0.0), NAME: 1.0, "original": 0.0}


def test_bad_parameters_of_the_toy_transform_name_the_key(toy_transform):
    with pytest.raises(ValueError, match=rf"params\['{NAME}'\]: {NAME} has no parameter 'marks'; it takes mark"):
        hsa.HSAConfig(params={NAME: {"marks": "!"}})
    with pytest.raises(ValueError, match=rf"HSAConfig.params\['{NAME}'\]\['mark'\] = 3: expected a str"):
        hsa.HSAConfig(params={NAME: {"mark": 3}})


def test_without_the_registration_the_name_is_refused():
    assert NAME not in hsa.transform_names()
    with pytest.raises(ValueError, match=f"HSAConfig: unknown transform '{NAME}'"):
        hsa.HSAConfig(probs={NAME: 1.0})
