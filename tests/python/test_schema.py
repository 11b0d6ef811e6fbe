"""The generated JSON Schema, read by a real JSON Schema validator (what editors use).

Every shipped scenario must validate; the invalid fixtures that the schema can see (unknown
kinds, unknown fields, wrong types, missing required fields) must not.
"""
import glob
import json
import pathlib

import jsonschema
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schema/scenario.schema.json").read_text())
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)


def test_schema_is_a_valid_draft7_schema():
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def shipped_scenarios():
    """Every YAML file under scenarios/ but the template folders' template.yaml files, which
    the loader leaves out too (`scenarios/custom/data/.ignore`)."""
    paths = glob.glob(str(ROOT / "scenarios/**/*.yaml"), recursive=True)
    return sorted(p for p in paths if pathlib.Path(p).name != "template.yaml")


@pytest.mark.parametrize("path", shipped_scenarios())
def test_shipped_scenarios_validate(path):
    for doc in yaml.safe_load_all(open(path)):
        errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in VALIDATOR.iter_errors(doc)]
        assert errors == [], errors


@pytest.mark.parametrize(
    "name",
    ["unknown-kind", "unknown-field", "wrong-type", "missing-required", "no-steps", "nested-fields"],
)
def test_invalid_fixtures_are_rejected(name):
    doc = yaml.safe_load(open(ROOT / f"tests/fixtures/invalid/{name}.yaml"))
    assert list(VALIDATOR.iter_errors(doc)), f"{name} should not validate"


# Values `steps::args::convert` accepts (and `check` with it), and some it refuses: the schema
# reads them the same way.
@pytest.mark.parametrize(
    "step,valid",
    [
        ({"http-get": {"port": "8000"}}, True),
        ({"http-get": {"port": " -3 "}}, True),
        ({"http-get": {"port": "abc"}}, False),
        ({"exec": {"cmd": "x", "background": " True "}}, True),
        ({"exec": {"cmd": "x", "background": "yes"}}, False),
        ({"exec": {"cmd": "x", "background": 1}}, False),
        ({"exec": {"cmd": "x", "background": "{{ vars.bg }}"}}, True),
        ({"assert": {"that": 1}}, True),
    ],
)
def test_schema_reads_typed_fields_as_the_checker_does(step, valid):
    doc = {"name": "x", "steps": [{"create": "base"}, step]}
    assert (list(VALIDATOR.iter_errors(doc)) == []) == valid, step
