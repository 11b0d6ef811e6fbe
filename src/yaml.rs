//! YAML text to a spanned node tree.
//!
//! Later phases never see raw YAML: they see [`Node`]s that remember where they came from, so
//! every semantic error (unknown step, wrong type, expression error) can point at
//! `file:line:col`. We build the tree from `saphyr-parser` events ourselves rather than going
//! through serde, because serde's flatten/untagged paths lose positions, and because the step
//! registry, not a derive, decides which fields a step has.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use crate::diag::{Diagnostic, Source};

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// A YAML value and where it starts (1-based line and column) and how long it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub line: u32,
    pub col: u32,
    pub len: usize,
    /// Block scalars (`|`, `>`) start their content on the next line.
    pub block: bool,
}

impl Node {
    pub fn type_name(&self) -> &'static str {
        match &self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    /// The key's text, for map keys (non-string keys render as YAML would print them).
    pub fn key_text(&self) -> String {
        match &self.value {
            Value::Str(s) => s.clone(),
            Value::Null => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            _ => "<complex key>".into(),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }

    /// A diagnostic pointing at this node.
    pub fn diag(&self, source: &Source, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(source, self.line, self.col, self.len, message)
    }

    /// Plain JSON form (templates left as they are).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as JsonValue;
        match &self.value {
            Value::Null => JsonValue::Null,
            Value::Bool(b) => JsonValue::Bool(*b),
            Value::Int(i) => JsonValue::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(JsonValue::Null, JsonValue::Number),
            Value::Str(s) => JsonValue::String(s.clone()),
            Value::Seq(items) => JsonValue::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(m) => JsonValue::Object(m.iter().map(|(k, v)| (k.key_text(), v.to_json())).collect()),
        }
    }
}

/// Parse every document of a YAML stream. Errors are diagnostics; the first syntax error ends
/// parsing of that file (the rest of the file cannot be trusted), but duplicate keys are
/// collected.
pub fn parse(source: &Source) -> Result<Vec<Node>, Vec<Diagnostic>> {
    match parse_keeping_going(source)? {
        (docs, diags) if diags.is_empty() => Ok(docs),
        (_, diags) => Err(diags),
    }
}

/// Like [`parse`], but problems that leave the tree usable (duplicate keys) come back beside
/// it, so validation can go on and report everything at once. `Err` is a syntax error.
pub fn parse_keeping_going(source: &Source) -> Result<(Vec<Node>, Vec<Diagnostic>), Vec<Diagnostic>> {
    let mut builder = Builder {
        source,
        stack: Vec::new(),
        docs: Vec::new(),
        anchors: HashMap::new(),
        diags: Vec::new(),
        alias_nodes: 0,
        fatal: false,
    };
    let mut parser = Parser::new_from_str(&source.text);
    while let Some(event) = parser.next_event() {
        match event {
            Ok((event, span)) => {
                builder.event(event, span);
                if builder.fatal {
                    return Err(builder.diags);
                }
            }
            Err(e) => {
                let m = e.marker();
                let (line, col) = (m.line() as u32, m.col() as u32 + 1);
                let mut d = Diagnostic::new(source, line.max(1), col, 1, format!("invalid YAML: {}", e.info()));
                let line_text = source.line_text(line).unwrap_or("");
                if e.info().contains("tab")
                    || line_text.starts_with('\t')
                    || line_text.trim_start_matches(' ').starts_with('\t')
                {
                    d = d.help("YAML indentation must use spaces, not tabs");
                } else if e.info().contains("mapping values are not allowed") {
                    d = d.help("a `: ` inside a plain value starts a mapping: quote the whole value, or use a block scalar (`>-`)");
                } else if line_text.contains("{{") {
                    d = d.help("quote values that start with a template: `exec: \"{{ vars.cmd }}\"`");
                }
                builder.diags.push(d);
                return Err(builder.diags);
            }
        }
    }
    Ok((builder.docs, builder.diags))
}

/// How many nodes aliases may add to one file, in all: an anchor is a reference, an alias a
/// copy, so nine aliases of nine aliases of … (the "billion laughs") are exponential in the
/// text. Real scenarios reuse a few step lists; this is thousands of times more.
pub const MAX_ALIAS_NODES: usize = 100_000;

/// How deep collections may nest. Later phases walk the tree recursively (and dropping a
/// tree recurses), so an unbounded depth would overflow the stack; no scenario needs more
/// than a dozen levels.
pub const MAX_DEPTH: usize = 200;

/// Nodes in a tree (itself included) and its height (a scalar is 1).
#[derive(Clone, Copy)]
struct Shape {
    size: usize,
    height: usize,
}

impl Shape {
    const LEAF: Shape = Shape { size: 1, height: 1 };

    /// Add a child to a collection's shape.
    fn add(&mut self, child: Shape) {
        self.size += child.size;
        self.height = self.height.max(child.height + 1);
    }
}

/// A collection being built, with its shape so far.
enum Frame {
    Seq(Node, usize, Shape),
    /// The mapping, its anchor, its shape, the key waiting for its value, and the keys seen.
    Map(Node, usize, Shape, Option<Node>, Keys),
}

/// The keys of one mapping, for finding duplicates in O(1) per key (a linear scan made a
/// mapping of n keys cost n²: 40,000 `vars` took seconds).
#[derive(Default)]
struct Keys {
    /// Scalar keys by kind and text, with the line of the first.
    scalars: HashMap<(u8, String), u32>,
    /// Keys that are collections (rare): compared one by one.
    complex: Vec<(Value, u32)>,
}

impl Keys {
    /// The line of an equal key seen before, and remember this one.
    fn first_line(&mut self, key: &Node) -> Option<u32> {
        let scalar = match &key.value {
            Value::Null => Some((0, String::new())),
            Value::Bool(b) => Some((1, b.to_string())),
            Value::Int(i) => Some((2, i.to_string())),
            Value::Float(f) if f.is_nan() => None, // NaN equals nothing
            Value::Float(f) => Some((3, f.to_bits().to_string())),
            Value::Str(s) => Some((4, s.clone())),
            Value::Seq(_) | Value::Map(_) => {
                if let Some((_, line)) = self.complex.iter().find(|(v, _)| *v == key.value) {
                    return Some(*line);
                }
                self.complex.push((key.value.clone(), key.line));
                return None;
            }
        };
        let k = scalar?;
        match self.scalars.get(&k) {
            Some(line) => Some(*line),
            None => {
                self.scalars.insert(k, key.line);
                None
            }
        }
    }
}

struct Builder<'a> {
    source: &'a Source,
    stack: Vec<Frame>,
    docs: Vec<Node>,
    /// Anchored nodes with their shapes.
    anchors: HashMap<usize, (Node, Shape)>,
    diags: Vec<Diagnostic>,
    /// Nodes added by aliases so far.
    alias_nodes: usize,
    /// A problem that makes the rest of the file untrustworthy (too deep): stop there.
    fatal: bool,
}

fn node_at(span: Span, value: Value) -> Node {
    Node {
        value,
        line: span.start.line() as u32,
        col: span.start.col() as u32 + 1,
        len: span.len().max(1),
        block: false,
    }
}

impl Builder<'_> {
    fn event(&mut self, event: Event<'_>, span: Span) {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let tag_str = tag.as_ref().map(|t| t.suffix.clone());
                let value = resolve_scalar(&text, style, tag_str.as_deref());
                let mut node = node_at(span, value);
                node.block = matches!(style, ScalarStyle::Literal | ScalarStyle::Folded);
                if matches!(style, ScalarStyle::Plain) {
                    node.len = text.chars().count().max(1);
                }
                self.push_value(node, anchor, Shape::LEAF);
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    let d = node_at(span, Value::Null)
                        .diag(self.source, format!("collections nest more than {MAX_DEPTH} levels deep"))
                        .label("too deep")
                        .help("a scenario needs a few levels; flatten the structure");
                    self.diags.push(d);
                    self.fatal = true;
                    return;
                }
                let frame = if matches!(event, Event::SequenceStart(..)) {
                    Frame::Seq(node_at(span, Value::Seq(Vec::new())), anchor, Shape::LEAF)
                } else {
                    Frame::Map(node_at(span, Value::Map(Vec::new())), anchor, Shape::LEAF, None, Keys::default())
                };
                self.stack.push(frame);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(frame) = self.stack.pop() {
                    let (node, anchor, shape) = match frame {
                        Frame::Seq(n, a, shape) => (n, a, shape),
                        Frame::Map(n, a, shape, _, _) => (n, a, shape),
                    };
                    self.push_value(node, anchor, shape);
                }
            }
            Event::Alias(id) => {
                let at = node_at(span, Value::Null);
                let (node, shape) = match self.anchors.get(&id) {
                    Some((_, shape)) if self.stack.len() + shape.height > MAX_DEPTH + 1 => {
                        let d = at
                            .diag(
                                self.source,
                                format!("this alias nests collections more than {MAX_DEPTH} levels deep"),
                            )
                            .label("too deep")
                            .help("a scenario needs a few levels; flatten the structure");
                        self.diags.push(d);
                        self.fatal = true;
                        (at, Shape::LEAF)
                    }
                    Some((_, shape)) if self.alias_nodes + shape.size > MAX_ALIAS_NODES => {
                        let d = at
                            .diag(
                                self.source,
                                format!("aliases in this file expand to more than {MAX_ALIAS_NODES} nodes"),
                            )
                            .label("this alias is one too many")
                            .help("each alias copies its anchor's whole value; nested aliases multiply");
                        self.diags.push(d);
                        self.fatal = true;
                        (at, Shape::LEAF)
                    }
                    Some((n, shape)) => {
                        self.alias_nodes += shape.size;
                        (Node { line: at.line, col: at.col, ..n.clone() }, *shape)
                    }
                    None => (at, Shape::LEAF),
                };
                self.push_value(node, 0, shape);
            }
            Event::StreamStart | Event::StreamEnd | Event::DocumentStart(_) | Event::DocumentEnd | Event::Nothing => {}
        }
    }

    fn push_value(&mut self, node: Node, anchor: usize, shape: Shape) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), shape));
        }
        match self.stack.last_mut() {
            None => self.docs.push(node),
            Some(Frame::Seq(seq, _, total)) => {
                total.add(shape);
                if let Value::Seq(items) = &mut seq.value {
                    items.push(node);
                }
            }
            Some(Frame::Map(map, _, total, pending, keys)) => {
                total.add(shape);
                match pending.take() {
                    None => *pending = Some(node),
                    Some(key) => {
                        if let Value::Map(entries) = &mut map.value {
                            if let Some(first) = keys.first_line(&key) {
                                let d = key
                                    .diag(self.source, format!("duplicate key `{}`", key.key_text()))
                                    .label("defined again here")
                                    .help(format!("the first `{}` is at line {first}", key.key_text()));
                                self.diags.push(d);
                            }
                            entries.push((key, node));
                        }
                    }
                }
            }
        }
    }
}

/// YAML 1.2 core schema resolution for plain scalars; quoted and block scalars are strings.
fn resolve_scalar(text: &str, style: ScalarStyle, tag: Option<&str>) -> Value {
    match tag {
        Some("str") => return Value::Str(text.to_string()),
        Some("int") => return text.parse().map(Value::Int).unwrap_or_else(|_| Value::Str(text.to_string())),
        _ => {}
    }
    if !matches!(style, ScalarStyle::Plain) {
        return Value::Str(text.to_string());
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        ".inf" | "+.inf" | ".Inf" | "+.Inf" => return Value::Float(f64::INFINITY),
        "-.inf" | "-.Inf" => return Value::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" => return Value::Float(f64::NAN),
        _ => {}
    }
    if let Some(hex) = text.strip_prefix("0x") {
        if let Ok(i) = i64::from_str_radix(hex, 16) {
            return Value::Int(i);
        }
    }
    if let Some(oct) = text.strip_prefix("0o") {
        if let Ok(i) = i64::from_str_radix(oct, 8) {
            return Value::Int(i);
        }
    }
    let numeric =
        text.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) && text.bytes().any(|b| b.is_ascii_digit());
    if numeric {
        if let Ok(i) = text.parse::<i64>() {
            return Value::Int(i);
        }
        if let Ok(f) = text.parse::<f64>() {
            return Value::Float(f);
        }
    }
    Value::Str(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Node {
        let src = Source::new("t.yaml", text);
        parse(&src).unwrap().remove(0)
    }

    #[test]
    fn keeps_positions_of_nested_values() {
        let n = one("name: x\nsteps:\n  - exec: echo hi\n    id: a\n");
        let steps = n.get("steps").unwrap().as_seq().unwrap();
        let (k, v) = &steps[0].as_map().unwrap()[0];
        assert_eq!((k.line, k.col, k.len), (3, 5, 4));
        assert_eq!((v.line, v.col), (3, 11));
        assert_eq!(v.as_str(), Some("echo hi"));
    }

    #[test]
    fn resolves_core_schema_scalars() {
        let n = one("a: 3\nb: '3'\nc: true\nd: ~\ne: 1.5\nf: 30s\n");
        assert_eq!(n.get("a").unwrap().value, Value::Int(3));
        assert_eq!(n.get("b").unwrap().value, Value::Str("3".into()));
        assert_eq!(n.get("c").unwrap().value, Value::Bool(true));
        assert_eq!(n.get("d").unwrap().value, Value::Null);
        assert_eq!(n.get("e").unwrap().value, Value::Float(1.5));
        assert_eq!(n.get("f").unwrap().value, Value::Str("30s".into()));
    }

    #[test]
    fn tabs_are_reported_with_a_hint() {
        let src = Source::new("t.yaml", "name: x\nsteps:\n\t- exec: hi\n");
        let d = parse(&src).unwrap_err();
        assert_eq!(d[0].location.line, 3);
        assert!(d[0].help.as_deref().unwrap().contains("tabs"), "{:?}", d[0]);
    }

    #[test]
    fn duplicate_keys_are_reported() {
        let src = Source::new("t.yaml", "name: x\nname: y\n");
        let d = parse(&src).unwrap_err();
        assert_eq!((d[0].location.line, d[0].location.col), (2, 1));
        assert!(d[0].message.contains("duplicate key `name`"));
    }

    #[test]
    fn duplicate_keys_among_many_and_of_every_kind() {
        let mut text: String = (0..20_000).map(|i| format!("k{i}: {i}\n")).collect();
        text.push_str("k17: again\n1: a\n1: b\n'1': c\n.nan: 1\n.nan: 2\n");
        let src = Source::new("t.yaml", text);
        let d = parse(&src).unwrap_err();
        let msgs: Vec<String> = d.iter().map(|d| d.message.clone()).collect();
        assert_eq!(msgs, ["duplicate key `k17`", "duplicate key `1`"]);
        assert_eq!(d[0].help.as_deref(), Some("the first `k17` is at line 18"));
    }

    #[test]
    fn alias_expansion_and_depth_are_bounded() {
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            bomb.push_str(&format!("a{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 10].join(", ")));
        }
        let d = parse(&Source::new("t.yaml", bomb)).unwrap_err();
        assert!(d[0].message.contains("expand to more than"), "{:?}", d[0]);
        assert_eq!(d[0].location.line, 5, "the first alias over the budget");
        // Small reuse is fine.
        let ok = parse(&Source::new("t.yaml", "a: &s [1, 2]\nb: [*s, *s, *s]\n")).unwrap();
        assert_eq!(ok[0].get("b").unwrap().as_seq().unwrap().len(), 3);
        // An alias cannot smuggle in depth.
        let deep =
            format!("a: &d {}{}\nb: {}*d{}\n", "[".repeat(150), "]".repeat(150), "[".repeat(100), "]".repeat(100));
        let d = parse(&Source::new("t.yaml", deep)).unwrap_err();
        assert!(d[0].message.contains("levels deep"), "{:?}", d[0]);
    }

    #[test]
    fn several_documents() {
        let src = Source::new("t.yaml", "name: a\n---\nname: b\n");
        assert_eq!(parse(&src).unwrap().len(), 2);
    }
}
