"""The studies' shared skeleton: a preset section read into a plan dataclass (unknown keys refused in one line), the
plan's dict in the order its JSON has always had, and the decode stage through the row cache with the lossless
check (fresh rows that are not lossless are never cached)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest

from lit_domino.studies.common import NotLosslessError
from lit_domino.studies.skeleton import REUSED, Stages, plan_dict, section_fields


@dataclass(frozen=True)
class Plan:
    prompts: dict
    """Prompts per domain."""
    seed: int = 0
    """The seed."""
    threads: int | None = None
    """CPU threads."""
    drafters: list = field(default_factory=list)
    """Set by the study."""
    given: tuple = ()
    """The section's keys in the file's order."""


def test_a_section_becomes_a_plan_and_its_dict_keeps_the_files_order():
    section = {"threads": 1, "prompts": {"math": 2}}
    fields = section_fields(Plan, section, "study.yaml: presets.smoke", fixed=("drafters",))
    assert fields["given"] == ("threads", "prompts")
    plan = Plan(**fields, drafters=["domino"])
    fields["prompts"]["math"] = 5  # a deep copy: the plan never shares the file's dicts
    assert section["prompts"] == {"math": 2}
    # the section's keys first, then what the study always sets; ``seed`` (left out, not always set) stays out
    assert list(plan_dict(plan, ("drafters", "prompts"))) == ["threads", "prompts", "drafters"]


@pytest.mark.parametrize("section, needle", [({"promts": {}}, "unknown keys ['promts']"),
                                             ({"drafters": ["x"]}, "unknown keys ['drafters']")])
def test_an_unknown_or_fixed_key_is_one_line(section, needle):
    with pytest.raises(KeyError, match=r"study.yaml: presets.smoke: " + needle.replace("[", r"\[")):
        section_fields(Plan, section, "study.yaml: presets.smoke", KeyError, fixed=("drafters",))


def test_decode_caches_reuses_and_never_caches_rows_that_are_not_lossless(tmp_path, capsys):
    key = {"test": uuid.uuid4().hex}
    good = [{"kind": "drafter", "temperature": 0.0, "match_baseline": 1.0, "method": "d", "benchmark": "b"}]
    bad = [dict(good[0], match_baseline=0.5)]
    measured = []

    def measure(rows):
        def run():
            measured.append(1)
            return rows
        return run

    stages = Stages("test")
    out = tmp_path / "not-lossless.json"
    with pytest.raises(NotLosslessError, match="1 test study rows are not lossless"):
        stages.decode(key, "skeleton", measure(bad), lossless=out, what="test study")
    assert out.is_file()  # the offending rows, for the diagnosis
    assert stages.decode(key, "skeleton", measure(good), lossless=out, what="test study") == good
    assert not stages.reused and measured == [1, 1]  # the bad rows were not cached: measured again
    assert stages.decode(key, "skeleton", measure(bad), lossless=out, what="test study") == good
    assert stages.reused and measured == [1, 1] and REUSED in capsys.readouterr().out

