"""Persona files: the declarative check, the user's words, and the errors a person gets."""

from __future__ import annotations

import re

import pytest

from clawproxy.errors import ConfigError
from clawproxy.simulate.checks import CheckError, parse_check, sentences
from clawproxy.simulate.personas import (
    PREFERENCES,
    load_persona_file,
    make_persona,
    shipped_personas,
)

PROSE = "Boil the water. Add the egg gently. Wait nine minutes, then cool it."
LIST = "- Boil the water\n- Add the egg\n- Wait nine minutes"
STEPS = "1. Boil the water\n2. Add the egg\n3. Wait nine minutes"


def check(spec):
    return parse_check(spec)


def test_word_sentence_and_line_limits():
    assert check({"words": {"max": 5}})("one two three four five")
    assert not check({"words": {"max": 5}})("one two three four five six")
    assert not check({"words": {"min": 1}})("")
    assert sentences(PROSE) == ["Boil the water.", "Add the egg gently.", "Wait nine minutes, then cool it."]
    assert check({"sentences": {"max": 3}})(PROSE) and not check({"sentences": {"max": 2}})(PROSE)
    assert check({"lines": {"min": 3}})(LIST) and not check({"lines": {"min": 2}})(PROSE)


def test_patterns_lines_starts_and_ends():
    assert check({"matches": "(?i)tl;dr"})("Long text.\nTL;DR: boil it.")
    assert not check({"not_matches": ["(?i)sorry", "(?i)certainly"]})("Certainly, here it is.")
    numbered = {"lines_matching": {"pattern": r"\s*\d+[.)]\s", "min": 3, "share": 0.6}}
    assert check(numbered)(STEPS) and not check(numbered)(LIST)
    assert not check({"lines_matching": {"pattern": r"\s*\d+[.)]\s", "min": 2, "share": 0.9}})(STEPS + "\nIntro.")
    assert check({"starts_with": "(?i)short answer:"})("Short answer: yes.\nMore below.")
    assert not check({"starts_with": "(?i)short answer:"})("Well. Short answer: yes.")
    assert check({"ends_with": r"(?i)confidence: (high|medium|low)\.?"})("Yes.\nConfidence: high.")
    assert not check({"ends_with": r"(?i)confidence: (high|medium|low)\.?"})("Confidence: high.\nYes.")


def test_checks_combine():
    both = check([{"words": {"max": 20}}, {"lines_matching": {"pattern": r"\s*- ", "min": 2}}])
    assert both(LIST) and not both(PROSE) and not both(LIST + "\n" + " ".join(["word"] * 20))
    either = check({"any_of": [{"lines_matching": {"pattern": r"\s*- ", "min": 2}},
                               {"lines_matching": {"pattern": r"\s*\d+\. ", "min": 2}}]})
    assert either(LIST) and either(STEPS) and not either(PROSE)
    assert check({"not": {"matches": "!"}})(PROSE) and not check({"all_of": [{"not": {"matches": "egg"}}]})(PROSE)


def test_found_is_the_first_objectionable_text():
    c = check([{"words": {"min": 1}}, {"not_matches": ["(?i)hope this helps", "(?i)certainly"]}])
    assert c.found("Certainly. Boil it. Hope this helps!") == "Certainly"
    assert c.found("Boil it.") is None


@pytest.mark.parametrize(("spec", "where", "fix"), [
    ({"wordz": {"max": 3}}, "check.wordz", "unknown check; use one of: words"),
    ({"words": 40}, "check.words", "{min: N, max: N}"),
    ({"words": {"min": 5, "max": 2}}, "check.words", "below min"),
    ({"words": {"max": -1}}, "check.words.max", "whole number"),
    ({"matches": "("}, "check.matches", "not a valid regular expression"),
    ([{"words": {"max": 3}}, {"lines_matching": {"min": 2}}], "check[1].lines_matching", "{pattern: REGEX"),
    ({"lines_matching": {"pattern": "- ", "share": 2}}, "check.lines_matching.share", "between 0 and 1"),
    ({"words": {"max": 3}, "lines": {"min": 2}}, "check", "one key per check"),
    ([], "check", "at least one check"),
    ({"any_of": []}, "check.any_of", "list of checks"),
])
def test_a_bad_check_names_the_key_and_what_to_write(spec, where, fix):
    with pytest.raises(CheckError) as e:
        parse_check(spec)
    assert e.value.where == where
    assert fix in str(e.value)


def write(tmp_path, text, name="mine.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


MINE = """\
wants: a one-line TL;DR at the end
told: End every answer with a line that starts with 'TL;DR:' and sums it up in one sentence.
check:
  - words: {min: 5}
  - ends_with: '(?im)^TL;DR:[^\\n]+'
praise: ["nice summary at the end", "good, the tldr helps"]
complaints: ["I don't have time to read all of it", "what's the bottom line"]
requests: ["can you add a one-line summary at the end"]
"""


def test_a_persona_file_of_ones_own(tmp_path):
    path = write(tmp_path, MINE)
    pref, words = load_persona_file(path)
    assert pref.name == "mine" and pref.hint.startswith("End every answer")
    assert pref.check("Boil the egg for nine minutes.\nTL;DR: nine minutes.")
    assert not pref.check("Boil the egg for nine minutes.")
    assert words.requests == ["can you add a one-line summary at the end"]
    assert words.broken is not None and words.transitions  # the shared ones filled in
    p = make_persona(str(path), seed=3)
    unhappy = {p.react("q", "Boil the egg for nine minutes.", None).feedback for _ in range(30)}
    assert unhappy == {*words.complaints, *words.requests}
    r = p.react("q", "Boil the egg for nine minutes.\nTL;DR: nine minutes.", "How do I make tea?")
    assert r.met and r.feedback in words.praise and r.message.endswith(("make tea?", "How do I make tea?"))


@pytest.mark.parametrize(("text", "fix"), [
    (MINE.replace("told:", "toldd:"), "told: missing; write the preference told plainly"),
    (MINE.replace("wants: a one-line TL;DR at the end\n", ""), "wants: missing; write what the user wants"),
    (MINE.replace("  - words: {min: 5}", "  - words: 5"), "check[0].words: write {min: N, max: N}"),
    (MINE.replace('praise: ["nice summary at the end", "good, the tldr helps"]', "praise: []"), "praise"),
    (MINE.replace('praise: ["nice summary at the end", "good, the tldr helps"]', "praise: [yes, good]"),
     "praise.0: Input should be a valid string (got True; put the phrase in quotes)"),
    ("- just a list", "write a mapping with the keys wants, told, check"),
    ("wants: [", "not valid YAML"),
])
def test_a_bad_persona_file_names_the_key_and_what_to_write(tmp_path, text, fix):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(fix)) as e:
        make_persona(str(path))
    assert str(path) in e.value.message
    with pytest.raises(ConfigError, match="--persona-file"):
        make_persona(str(tmp_path / "missing.yaml"))


def test_the_shipped_personas_are_files():
    assert set(shipped_personas()) == set(PREFERENCES) == {"concise", "bullets", "no_filler", "sign_off"}
    for name, path in shipped_personas().items():
        pref, _ = load_persona_file(path)
        assert pref.name == name and pref.hint and pref.description


def test_a_too_short_answer_is_broken_to_the_new_user_and_fine_to_the_old_one():
    """A word or two answers nothing: the user complains even though it is under 40 words."""
    new, old = make_persona("concise", seed=0), make_persona("concise", seed=0, short_is_broken=False)
    r = new.react("How do I boil an egg?", "Boil it.", None)
    assert r.met and r.problem == "too_short" and r.feedback in new.words.broken.too_short
    r = old.react("How do I boil an egg?", "Boil it.", None)
    assert r.met and r.problem is None and r.feedback in old.words.praise


def test_the_docs_examples_are_valid_persona_files_and_checks(tmp_path):
    from pathlib import Path

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "personas.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, re.DOTALL)
    path = write(tmp_path, blocks[0], "tldr.yaml")
    pref, _ = load_persona_file(path)
    assert pref.check("Boil the egg for nine minutes.\nTL;DR: nine minutes in boiling water.")
    assert not pref.check("Boil the egg for nine minutes.")
    examples = [yaml.safe_load(line)["check"] for line in blocks[1].splitlines() if line.startswith("check:")]
    assert len(examples) == 5
    for spec in examples:
        parse_check(spec)
    assert parse_check(examples[1])("1. Boil\n2. Wait\n3. Cool") and not parse_check(examples[1])(PROSE)
