"""The Chinese documents keep up with the English ones (issue 16).

README.zh-CN.md, docs/reference.zh-CN.md and KNOWN-ISSUES.zh-CN.md translate the prose and keep every identifier as it
is. These tests catch the drift a translation is prone to: a command, a variable, a flag or a
known-issue id added to the English file and not to the Chinese one (or mistyped there). They
do not judge the prose.
"""
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.S | re.M)
# A shell comment after a command: prose, which the Chinese file may translate.
SH_COMMENT = re.compile(r"\s+#\s.*$")
# In the usage block, `scenario-run check [PATHS…]      validate only: …`: the description may
# be translated, the command may not.
USAGE_DESCRIPTION = re.compile(r"\s{2,}\S.*$")
VARIABLE = re.compile(r"\b(?:SCENARIO_RUN|E2E|E2B|ABX)_[A-Z0-9_]*[A-Z0-9]\b")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
KNOWN_ISSUE_ID = re.compile(r"\bKI-[A-Z0-9]+\b")
# The README is the first page; the reference beside it holds the rest (issue 37 item 13).
DOCS = [("README.md", "README.zh-CN.md"), ("docs/reference.md", "docs/reference.zh-CN.md")]


def read(name):
    return (ROOT / name).read_text(encoding="utf-8")


def fenced_blocks(text):
    return [(lang.strip(), body) for lang, body in FENCE.findall(text)]


def command_lines(lang, body):
    """The lines of a fenced block that must reach the translation unchanged.

    Shell blocks: each command, without its comments. The usage block: each `scenario-run …`
    command, without its description. Other blocks (what the binary prints, the source layout):
    every line, as they show English text the binary writes or paths with notes.
    """
    for line in body.splitlines():
        if lang in ("sh", "bash", "console"):
            if line.lstrip().startswith("#"):
                continue  # a comment line is prose
            line = SH_COMMENT.sub("", line)
        elif line.startswith("scenario-run "):
            line = USAGE_DESCRIPTION.sub("", line)
        if line.strip():
            yield line.rstrip()


def non_yaml_blocks(name):
    return [(lang, body) for lang, body in fenced_blocks(read(name)) if lang != "yaml"]


@pytest.mark.parametrize(
    "english, chinese", DOCS + [("KNOWN-ISSUES.md", "KNOWN-ISSUES.zh-CN.md")]
)
def test_each_language_links_to_the_other(english, chinese):
    def name(path):
        return path.rsplit("/", 1)[-1]

    assert f"({name(chinese)})" in read(english).split("\n\n", 2)[1], f"{english} starts with a link to {chinese}"
    head = read(chinese).split("\n\n", 2)[1]
    assert f"({name(english)})" in head and "以英文版为准" in head, (
        f"{chinese} starts with a link to {english}, the reference when they differ"
    )


@pytest.mark.parametrize("english, chinese", DOCS)
def test_every_command_line_of_the_readme_is_in_the_chinese_readme(english, chinese):
    chinese_lines = {line.rstrip() for lang, body in non_yaml_blocks(chinese) for line in command_lines(lang, body)}
    missing = [
        line for lang, body in non_yaml_blocks(english) for line in command_lines(lang, body) if line not in chinese_lines
    ]
    assert missing == [], f"lines of {english}'s code blocks missing from {chinese}'s code blocks"


@pytest.mark.parametrize("english, chinese", DOCS)
def test_every_yaml_example_of_the_readme_is_in_the_chinese_readme(english, chinese):
    """Compared as data: the comments of a YAML example may be translated, nothing else."""
    chinese_docs = [yaml.safe_load(body) for lang, body in fenced_blocks(read(chinese)) if lang == "yaml"]
    english_docs = [yaml.safe_load(body) for lang, body in fenced_blocks(read(english)) if lang == "yaml"]
    assert english_docs, f"{english} has YAML examples"
    missing = [doc for doc in english_docs if doc not in chinese_docs]
    assert missing == [], f"YAML examples of {english} missing or changed in {chinese}"


@pytest.mark.parametrize("english, chinese", DOCS)
@pytest.mark.parametrize(
    "what, pattern", [("environment variables", VARIABLE), ("flags", FLAG)], ids=["variables", "flags"]
)
def test_every_variable_and_flag_of_the_readme_is_in_the_chinese_readme(what, pattern, english, chinese):
    named = set(pattern.findall(read(english)))
    assert named, f"{english} names {what}"
    translated = set(pattern.findall(read(chinese)))
    assert sorted(named - translated) == [], f"{what} named in {english} but not in {chinese}"


def test_every_known_issue_is_in_the_chinese_known_issues():
    english = set(KNOWN_ISSUE_ID.findall(read("KNOWN-ISSUES.md")))
    assert "KI-001" in english
    chinese = set(KNOWN_ISSUE_ID.findall(read("KNOWN-ISSUES.zh-CN.md")))
    assert sorted(english ^ chinese) == [], "KNOWN-ISSUES.md and KNOWN-ISSUES.zh-CN.md list different ids"


def test_every_pinned_scenario_of_the_known_issues_is_in_the_chinese_known_issues():
    pinned = set(re.findall(r"`(scenarios/[^`]+\.yaml)`", read("KNOWN-ISSUES.md")))
    assert pinned, "KNOWN-ISSUES.md names the scenarios that pin its issues"
    for path in pinned:
        assert (ROOT / path).is_file(), f"{path} is named in KNOWN-ISSUES.md but does not exist"
    assert sorted(pinned - set(re.findall(r"`(scenarios/[^`]+\.yaml)`", read("KNOWN-ISSUES.zh-CN.md")))) == []
