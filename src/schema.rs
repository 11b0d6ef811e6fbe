//! The JSON Schema for scenario files and the `scenario-run steps` reference, both generated
//! from the step registry so they cannot drift from what the validator accepts.

use std::fmt::Write as _;

use serde_json::{json, Map, Value as JsonValue};

use crate::steps::registry::{Field, FieldType, StepKind, COMMON_KEYS, REGISTRY};

pub const SCHEMA_PATH: &str = "schema/scenario.schema.json";

fn templated(schema: JsonValue) -> JsonValue {
    // Any typed field may instead hold a template string rendered at run time.
    json!({ "anyOf": [schema, { "type": "string", "pattern": "\\{[{%]" }] })
}

fn field_schema(f: &Field) -> JsonValue {
    let mut s = match f.ty {
        FieldType::Str => json!({ "type": ["string", "number", "boolean"] }),
        // As `steps::args::convert` reads them: a string may hold the integer or the boolean.
        FieldType::Int => templated(
            json!({ "anyOf": [{ "type": "integer" }, { "type": "string", "pattern": "^\\s*[-+]?[0-9]+\\s*$" }] }),
        ),
        FieldType::Bool => templated(json!({ "anyOf": [
            { "type": "boolean" },
            { "type": "string", "pattern": "^\\s*([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])\\s*$" },
        ] })),
        FieldType::Duration => json!({ "$ref": "#/definitions/duration" }),
        FieldType::StrMap => {
            templated(json!({ "type": "object", "additionalProperties": { "type": ["string", "number", "boolean"] } }))
        }
        FieldType::StrList => json!({
            "anyOf": [{ "type": ["string", "number", "boolean"] }, { "type": "array", "items": { "type": ["string", "number", "boolean"] } }]
        }),
        FieldType::Range(lo, hi) => templated(json!({ "anyOf": [
            { "type": "integer", "minimum": lo, "maximum": hi },
            { "type": "string", "pattern": "^\\s*[-+]?[0-9]+\\s*$" },
        ] })),
        FieldType::IntList => {
            let int =
                json!({ "anyOf": [{ "type": "integer" }, { "type": "string", "pattern": "^\\s*[-+]?[0-9]+\\s*$" }] });
            templated(json!({ "anyOf": [int, { "type": "array", "items": int }] }))
        }
        FieldType::Matcher => json!({ "$ref": "#/definitions/matcher" }),
        FieldType::Enum(options) => templated(json!({ "enum": options })),
        FieldType::Signal => json!({ "type": ["integer", "string"] }),
        // An expression, or any value whose truth counts (what a template renders to).
        FieldType::Expr => json!({}),
        FieldType::Any if f.name == "json" => json!({ "$ref": "#/definitions/json_checks" }),
        FieldType::Any => json!({}),
        FieldType::Object(fields) => object(fields, false),
    };
    if let JsonValue::Object(m) = &mut s {
        m.insert("description".into(), JsonValue::String(f.doc.to_string()));
    }
    s
}

fn object(fields: &[Field], matcher: bool) -> JsonValue {
    let mut props = Map::new();
    for f in fields {
        props.insert(f.name.to_string(), field_schema(f));
    }
    if matcher {
        for (k, _) in crate::matcher::KEYS {
            props.insert(k.to_string(), json!({ "$ref": format!("#/definitions/matcher_object/properties/{k}") }));
        }
    }
    let required: Vec<&str> = fields.iter().filter(|f| f.required).map(|f| f.name).collect();
    let mut o = json!({ "type": "object", "properties": props, "additionalProperties": false });
    if !required.is_empty() {
        o["required"] = json!(required);
    }
    o
}

fn kind_schema(k: &StepKind) -> JsonValue {
    let args = if k.free_keys {
        json!({ "type": "object", "description": "names to values" })
    } else {
        let obj = object(k.fields, k.matcher);
        let mut variants = vec![obj];
        if let Some(main) = k.main {
            // A matcher step's shorthand is `equals`: any scalar.
            let main_schema =
                k.field(main).map(field_schema).unwrap_or(json!({ "type": ["string", "number", "boolean"] }));
            variants.push(main_schema);
        }
        if !k.fields.iter().any(|f| f.required) {
            variants.push(json!({ "type": "null" }));
        }
        json!({ "anyOf": variants })
    };
    let mut props = Map::new();
    let mut args = args;
    args["description"] = JsonValue::String(k.summary.to_string());
    props.insert(k.name.to_string(), args);
    for (key, _) in COMMON_KEYS {
        props.insert(key.to_string(), json!({ "$ref": format!("#/definitions/common/{key}") }));
    }
    json!({ "type": "object", "required": [k.name], "properties": props, "additionalProperties": false })
}

pub fn schema() -> JsonValue {
    let common: Map<String, JsonValue> = COMMON_KEYS
        .iter()
        .map(|(k, doc)| {
            let s = match *k {
                "id" => json!({ "type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" }),
                "name" | "sandbox" => json!({ "type": "string" }),
                "timeout" => json!({ "$ref": "#/definitions/duration" }),
                "retry" => json!({ "anyOf": [
                    { "type": "integer", "minimum": 1, "maximum": crate::model::MAX_ATTEMPTS },
                    { "type": "object", "additionalProperties": false, "properties": {
                        "attempts": { "type": "integer", "minimum": 1, "maximum": crate::model::MAX_ATTEMPTS },
                        "delay": { "$ref": "#/definitions/duration" },
                        "backoff": { "type": "number", "minimum": 1, "maximum": crate::model::MAX_BACKOFF } } } ] }),
                "eventually" => json!({ "anyOf": [
                    { "$ref": "#/definitions/duration" },
                    { "type": "object", "additionalProperties": false, "properties": {
                        "within": { "$ref": "#/definitions/duration" }, "every": { "$ref": "#/definitions/duration" } } } ] }),
                "if" => json!({ "type": ["string", "boolean"] }),
                "continue_on_error" => json!({ "type": "boolean" }),
                "requires" => json!({ "type": "object", "additionalProperties": false, "properties": {
                    "env": { "type": "array", "items": { "type": "string" } } } }),
                "expect_error" => {
                    // A matcher for the message, and `kind`: one kind of error or a list.
                    let mut props: Map<String, JsonValue> = crate::matcher::KEYS
                        .iter()
                        .map(|(k, _)| (k.to_string(), json!({ "$ref": format!("#/definitions/matcher_object/properties/{k}") })))
                        .collect();
                    let kinds: Vec<&str> = crate::model::ErrorClass::ALL.iter().map(|(_, n)| *n).collect();
                    let kind = json!({ "type": "string", "enum": kinds });
                    props.insert("kind".into(), json!({ "anyOf": [kind, { "type": "array", "minItems": 1, "items": kind }] }));
                    json!({ "anyOf": [{ "type": "boolean" }, { "type": "object", "minProperties": 1, "additionalProperties": false, "properties": props }] })
                }
                _ => json!({}),
            };
            let mut s = s;
            s["description"] = JsonValue::String(doc.to_string());
            (k.to_string(), s)
        })
        .collect();
    let mut matcher_props = Map::new();
    for (k, doc) in crate::matcher::KEYS {
        let s = match *k {
            "equals" => json!({}),
            "contains" | "not_contains" | "starts_with" | "ends_with" => {
                json!({ "type": ["string", "number", "boolean"] })
            }
            "matches" => json!({ "type": "string", "format": "regex" }),
            "empty" => json!({ "type": "boolean" }),
            "lines" => {
                json!({ "anyOf": [{ "type": "integer", "minimum": 0 }, { "type": "array", "items": { "type": "string" } }] })
            }
            "length" => json!({ "type": "integer", "minimum": 0 }),
            "json" => json!({ "$ref": "#/definitions/json_checks" }),
            "not" => json!({ "$ref": "#/definitions/matcher" }),
            _ => json!({ "type": "array", "items": { "$ref": "#/definitions/matcher" } }),
        };
        let mut s = s;
        s["description"] = JsonValue::String(doc.to_string());
        matcher_props.insert(k.to_string(), s);
    }
    let mut step_variants: Vec<JsonValue> = REGISTRY.iter().map(kind_schema).collect();
    // Not a step kind: `include:` is replaced by the steps of the file it names when loaded.
    step_variants.push(json!({
        "type": "object", "required": ["include"], "additionalProperties": false,
        "properties": {
            "include": { "type": "string", "description": "a steps file (`kind: steps`), relative to this file; its steps run here" },
            "with": { "type": ["object", "null"], "description": "values of the steps file's `params`" } } }));
    let list = json!({ "type": ["array", "null"], "items": { "$ref": "#/definitions/step" } });
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://scenario-run.dev/schema/scenario.schema.json",
        "title": "scenario-run scenario",
        "description": "One scenario: steps run in order against sandboxes. Generated by `scenario-run schema`; do not edit.",
        "type": "object",
        "required": ["steps"],
        "additionalProperties": false,
        "properties": {
            "kind": { "const": "steps", "description": "a steps file for `include:` (with `params` and `steps`), not a scenario" },
            "params": { "type": "object", "description": "a steps file's parameters: `name: ~` (required), `name: <default>` or `name: { default, description }`" },
            "name": { "type": "string", "description": "unique within the run (file stem by default)" },
            "description": { "type": "string", "description": "what the scenario proves" },
            "tags": { "type": "array", "items": { "type": "string" }, "description": "for -t selection" },
            "timeout": { "$ref": "#/definitions/duration", "description": "limit for the whole scenario" },
            "requires": { "type": "object", "additionalProperties": false, "properties": {
                "env": { "type": "array", "items": { "type": "string" } },
                "providers": { "type": "array", "items": { "enum": crate::model::PROVIDERS } },
                "capabilities": { "type": "array", "items": { "enum": crate::model::capability::Capability::ALL.iter().map(|c| c.name()).collect::<Vec<_>>() } } } },
            "known_issue": { "type": "object", "additionalProperties": false, "required": ["reason"], "properties": {
                "id": { "type": "string" }, "reason": { "type": "string" }, "strict": { "type": "boolean" },
                "until": { "type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$" } } },
            "vars": { "type": "object" },
            "secrets": { "type": "array", "items": { "type": "string" }, "description": "names of environment variables to mask" },
            "matrix": { "type": "object", "additionalProperties": { "type": "array", "minItems": 1 } },
            "setup": list, "steps": { "type": "array", "minItems": 1, "items": { "$ref": "#/definitions/step" } }, "finally": list,
        },
        "definitions": {
            "duration": { "anyOf": [{ "type": "number", "minimum": 0 }, { "type": "string", "pattern": "^(\\d+(\\.\\d+)?(ms|s|m|h))+$|^\\d+(\\.\\d+)?$|\\{\\{" }] },
            "matcher_object": { "type": "object", "additionalProperties": false, "properties": matcher_props },
            "matcher": { "anyOf": [
                { "$ref": "#/definitions/matcher_object" },
                { "type": ["string", "number", "boolean", "null"] } ] },
            "json_checks": { "type": "array", "items": { "type": "object", "required": ["path"], "properties": { "path": { "type": "string" }, "exists": { "type": "boolean" } } } },
            "common": common,
            "step": { "oneOf": step_variants },
        }
    })
}

pub fn schema_text() -> String {
    let mut s = serde_json::to_string_pretty(&schema()).expect("schema serializes");
    s.push('\n');
    s
}

/// `scenario-run steps KIND` for a kind there is not; `suggestion` is the closest kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown step kind `{name}`{}", suggestion.as_ref().map(|s| format!("; did you mean `{s}`?")).unwrap_or_default())]
pub struct UnknownStepKind {
    pub name: String,
    pub suggestion: Option<String>,
}

/// `scenario-run steps [KIND]`.
pub fn steps_reference(only: Option<&str>) -> Result<String, UnknownStepKind> {
    let mut out = String::new();
    let kinds: Vec<&StepKind> = match only {
        Some(name) => vec![crate::steps::registry::lookup(name).ok_or_else(|| UnknownStepKind {
            name: name.to_string(),
            suggestion: crate::diag::did_you_mean(name, crate::steps::registry::names()).map(|s| s.to_string()),
        })?],
        None => REGISTRY.iter().collect(),
    };
    for k in kinds {
        let _ = writeln!(out, "{}\n  {}", k.name, k.summary);
        if let Some(m) = k.main {
            let _ = writeln!(out, "  shorthand: `{}: <value>` sets `{m}`", k.name);
        }
        if !k.fields.is_empty() {
            let _ = writeln!(out, "  fields:");
            for f in k.fields {
                let req = if f.required { " (required)" } else { "" };
                let _ = writeln!(out, "    {:<16} {:<14} {}{req}", f.name, f.ty.describe(), f.doc);
            }
        }
        if k.matcher {
            let _ = writeln!(
                out,
                "    + matcher keys: {}",
                crate::matcher::KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            );
        }
        if k.free_keys {
            let _ = writeln!(out, "  fields: any names; each value is bound under `vars`");
        }
        if !k.outputs.is_empty() {
            let _ = writeln!(out, "  outputs:");
            for (n, d) in k.outputs {
                let _ = writeln!(out, "    {n:<16} {d}");
            }
        }
        let _ = writeln!(out, "  example:");
        for line in k.example.lines() {
            let _ = writeln!(out, "    {line}");
        }
        out.push('\n');
    }
    if only.is_none() {
        let _ = writeln!(out, "common keys (beside any step kind):");
        for (k, d) in COMMON_KEYS {
            let _ = writeln!(out, "    {k:<18} {d}");
        }
        let _ = writeln!(out, "\nmatchers (assert-stdout, assert-stderr, assert-file, http expect.body):");
        for (k, d) in crate::matcher::KEYS {
            let _ = writeln!(out, "    {k:<18} {d}");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 28 item 4: an unknown kind carries the kind and the suggestion, and reads as before.
    #[test]
    fn unknown_step_kinds_carry_the_suggestion() {
        let e = steps_reference(Some("exce")).unwrap_err();
        assert_eq!(e, UnknownStepKind { name: "exce".into(), suggestion: Some("exec".into()) });
        assert_eq!(e.to_string(), "unknown step kind `exce`; did you mean `exec`?");
        let e = steps_reference(Some("zzzzzzzzzz")).unwrap_err();
        assert_eq!(e.suggestion, None);
        assert_eq!(e.to_string(), "unknown step kind `zzzzzzzzzz`");
        assert!(steps_reference(Some("exec")).unwrap().starts_with("exec\n"));
    }
}
