//! Why an expression was false: the value of each operand, as pytest's assertion rewriting
//! shows them (`assert 7 == 0` where `7 = vars.made.exit_code`).
//!
//! `assert: { that: vars.made.exit_code == 0 }` failing said only the expression. Here the
//! expression is split, outside strings and brackets, at `and`/`or` into clauses, a clause at
//! its comparison (`==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`, `is`), and each operand
//! that is not a literal is evaluated on its own against the same context: `where
//! vars.made.exit_code = 7`. An operand with filters (`steps.a.stdout | trim | length`) also
//! shows what the filters were given (`steps.a.stdout`). Nothing here decides the outcome: it
//! only explains a false one, and an operand that cannot be evaluated says why.
//!
//! [`one_line`] puts a multi-line expression (a YAML block scalar) on one line, so the first
//! line of a message holds all of it and no summary cuts it at a line break.

use minijinja::value::Value as MValue;

/// The most characters of one value shown; the rest is `…`.
pub const MAX_SHOWN: usize = 200;

/// A token of an expression, with its byte range in the text.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A name: `vars`, `and`, `not`, `true`, `length`.
    Name,
    /// A string or a number.
    Literal,
    Open,
    Close,
    /// `==`, `!=`, `<`, `<=`, `>`, `>=`.
    Compare,
    /// `|`.
    Pipe,
    /// Anything else: `.`, `,`, `+`, `~`, `:`.
    Punct,
}

fn tokens(text: &str) -> Vec<(Tok, usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let tok = match c {
            c if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            b'\'' | b'"' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(b.len());
                Tok::Literal
            }
            c if c.is_ascii_digit() => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                    i += 1;
                }
                Tok::Literal
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                Tok::Name
            }
            b'(' | b'[' | b'{' => {
                i += 1;
                Tok::Open
            }
            b')' | b']' | b'}' => {
                i += 1;
                Tok::Close
            }
            b'=' | b'!' | b'<' | b'>' if b.get(i + 1) == Some(&b'=') => {
                i += 2;
                Tok::Compare
            }
            b'<' | b'>' => {
                i += 1;
                Tok::Compare
            }
            b'|' => {
                i += 1;
                Tok::Pipe
            }
            _ => {
                // One character, whole (a multi-byte one too).
                i += text[i..].chars().next().map_or(1, char::len_utf8);
                Tok::Punct
            }
        };
        out.push((tok, start, i));
    }
    out
}

/// `{{ expr }}` without its braces; the expression otherwise.
fn bare(text: &str) -> &str {
    let t = text.trim();
    match t.strip_prefix("{{").and_then(|r| r.strip_suffix("}}")) {
        Some(inner) if !inner.contains("{{") => inner.trim(),
        _ => t,
    }
}

/// Whether `text` is one expression (bare, or one `{{ … }}`), rather than a template that
/// renders to one (`{{ vars.n }} > 5`).
pub fn is_single(text: &str) -> bool {
    let b = bare(text);
    !b.contains("{{") && !b.contains("{%")
}

/// The expression on one line: every run of whitespace outside strings is one space.
pub fn one_line(text: &str) -> String {
    let text = bare(text);
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (_, start, end) in tokens(text) {
        if start > last && !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&text[start..end]);
        last = end;
    }
    out
}

/// The expression on one line, at most `max` characters: cut between tokens (never inside a
/// string or a number), with `…` when cut.
pub fn shorten(text: &str, max: usize) -> String {
    let line = one_line(text);
    if line.chars().count() <= max {
        return line;
    }
    let end =
        tokens(&line).iter().map(|t| t.2).take_while(|&end| line[..end].chars().count() < max).last().unwrap_or(0);
    format!("{}…", line[..end].trim_end())
}

/// The operands of `text` worth showing, in order, each once: see the module doc.
pub fn operands(text: &str) -> Vec<String> {
    let text = bare(text);
    let toks = tokens(text);
    let mut out: Vec<String> = Vec::new();
    collect(text, &toks, &mut out);
    out
}

fn is_word(text: &str, t: &(Tok, usize, usize), word: &str) -> bool {
    t.0 == Tok::Name && &text[t.1..t.2] == word
}

/// The pieces of `toks` between top-level (depth 0) separators that `is_sep` picks, with the
/// separator's width in tokens (`not in`: 2).
fn split(
    toks: &[(Tok, usize, usize)],
    is_sep: impl Fn(&[(Tok, usize, usize)]) -> usize,
) -> Vec<&[(Tok, usize, usize)]> {
    let mut parts = Vec::new();
    let (mut depth, mut from, mut i) = (0i32, 0, 0);
    while i < toks.len() {
        match toks[i].0 {
            Tok::Open => depth += 1,
            Tok::Close => depth -= 1,
            _ => {}
        }
        let width = if depth == 0 { is_sep(&toks[i..]) } else { 0 };
        if width > 0 {
            parts.push(&toks[from..i]);
            i += width;
            from = i;
        } else {
            i += 1;
        }
    }
    parts.push(&toks[from..]);
    parts
}

fn collect(text: &str, toks: &[(Tok, usize, usize)], out: &mut Vec<String>) {
    // `a and b or c`: each clause on its own.
    let clauses = split(toks, |t| usize::from(is_word(text, &t[0], "and") || is_word(text, &t[0], "or")));
    for clause in clauses {
        // `not x`: x.
        let mut clause = clause;
        while clause.first().is_some_and(|t| is_word(text, t, "not")) {
            clause = &clause[1..];
        }
        // `(a or b)`: inside.
        if clause.first().is_some_and(|t| &text[t.1..t.2] == "(") && matching_close(clause) == Some(clause.len() - 1) {
            collect(text, &clause[1..clause.len() - 1], out);
            continue;
        }
        // `a == b`, `a in b`, `a not in b`, `a is defined`.
        let mut after_is = false;
        let sides = split(clause, |t| {
            if t[0].0 == Tok::Compare || is_word(text, &t[0], "in") {
                1
            } else if is_word(text, &t[0], "not") && t.get(1).is_some_and(|n| is_word(text, n, "in")) {
                2
            } else if is_word(text, &t[0], "is") {
                if t.get(1).is_some_and(|n| is_word(text, n, "not")) {
                    2
                } else {
                    1
                }
            } else {
                0
            }
        });
        if clause.iter().any(|t| is_word(text, t, "is")) {
            after_is = true;
        }
        for (n, side) in sides.iter().enumerate() {
            // The right of `is` is a test's name (`defined`, `none`), not a value.
            if after_is && n > 0 {
                continue;
            }
            operand(text, side, out);
        }
    }
}

/// Where the bracket opening `toks` closes.
fn matching_close(toks: &[(Tok, usize, usize)]) -> Option<usize> {
    let mut depth = 0;
    for (i, t) in toks.iter().enumerate() {
        match t.0 {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether these tokens are a literal: no names but `true`, `false`, `none`.
fn is_literal(text: &str, toks: &[(Tok, usize, usize)]) -> bool {
    toks.iter().all(|t| match t.0 {
        Tok::Name => matches!(&text[t.1..t.2], "true" | "false" | "none" | "True" | "False" | "None"),
        _ => true,
    })
}

/// One side of a comparison: shown unless it is a literal; with filters, their input too.
fn operand(text: &str, toks: &[(Tok, usize, usize)], out: &mut Vec<String>) {
    let mut push = |toks: &[(Tok, usize, usize)]| {
        let (Some(first), Some(last)) = (toks.first(), toks.last()) else { return };
        let shown = one_line(&text[first.1..last.2]);
        if !is_literal(text, toks) && !out.contains(&shown) {
            out.push(shown);
        }
    };
    // `steps.a.stdout | trim | length`: also `steps.a.stdout`.
    let pieces = split(toks, |t| usize::from(t[0].0 == Tok::Pipe));
    if pieces.len() > 1 {
        push(pieces[0]);
    }
    push(toks);
}

/// `value` as the explanation shows it: strings quoted and escaped (JSON), other values as
/// JSON, at most [`MAX_SHOWN`] characters.
pub fn show(value: &MValue) -> String {
    if value.is_undefined() {
        return "undefined".into();
    }
    let shown = match serde_json::to_value(value) {
        Ok(serde_json::Value::Null) => "none".to_string(),
        Ok(v) => v.to_string(),
        Err(_) => value.to_string(),
    };
    match shown.char_indices().nth(MAX_SHOWN) {
        Some((at, _)) => format!("{}…", &shown[..at]),
        None => shown,
    }
}

/// `where <operand> = <value>` for each operand of `text`, evaluated against `ctx`.
pub fn where_lines(text: &str, ctx: &MValue) -> Vec<String> {
    operands(text)
        .into_iter()
        .map(|op| {
            let value = super::env()
                .compile_expression(&op)
                .and_then(|e| e.eval(ctx.clone()))
                .map(|v| show(&v))
                .unwrap_or_else(|e| format!("<cannot evaluate: {}>", e.detail().unwrap_or(&e.kind().to_string())));
            format!("where {op} = {value}")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_of_comparisons_and_clauses() {
        assert_eq!(operands("vars.made.exit_code == 0"), ["vars.made.exit_code"]);
        assert_eq!(
            operands("{{ steps.a.exit_code != steps.b.exit_code }}"),
            ["steps.a.exit_code", "steps.b.exit_code"]
        );
        assert_eq!(
            operands("'ok' in steps.a.stdout and not (steps.a.exit_code > 0 or vars.x is defined)"),
            ["steps.a.stdout", "steps.a.exit_code", "vars.x"]
        );
        assert_eq!(
            operands("steps.a.stdout | trim | length >= 3"),
            ["steps.a.stdout", "steps.a.stdout | trim | length"]
        );
        assert_eq!(operands("'x' not in steps.a.json['names']"), ["steps.a.json['names']"]);
        assert_eq!(operands("steps.ok"), ["steps.ok"]);
        assert_eq!(operands("true"), Vec::<String>::new());
        assert_eq!(operands("[1, 2] == steps.a.json.list"), ["steps.a.json.list"]);
        assert_eq!(operands("(steps.a.exit_code) == 0"), ["(steps.a.exit_code)"]);
        // A string holding an operator is one literal.
        assert_eq!(operands("steps.a.stdout == 'a and b == c'"), ["steps.a.stdout"]);
    }

    #[test]
    fn shorten_cuts_between_tokens() {
        assert_eq!(shorten("a == 'x y z'", 60), "a == 'x y z'");
        assert_eq!(shorten("steps.a.stdout == 'a long string literal' and b", 30), "steps.a.stdout ==…");
        assert_eq!(shorten("steps.a.exit_code\n== 0", 60), "steps.a.exit_code == 0");
    }

    #[test]
    fn one_line_joins_lines_outside_strings() {
        assert_eq!(
            one_line("steps.a.json.items | length == 3\n  and steps.a.exit_code == 0\n"),
            "steps.a.json.items | length == 3 and steps.a.exit_code == 0"
        );
        assert_eq!(one_line("{{ a ==\n 'x  y' }}"), "a == 'x  y'");
        assert_eq!(one_line("f(a,b)"), "f(a,b)");
    }

    #[test]
    fn values_are_shown_as_json_and_bounded() {
        let ctx = MValue::from(minijinja::value::Serde(serde_json::json!({
            "vars": { "made": { "exit_code": 7, "stdout": "hi\n" } },
            "long": "x".repeat(500)
        })));
        assert_eq!(
            where_lines("vars.made.exit_code == 0 and vars.made.stdout | trim == 'ho'", &ctx),
            [
                "where vars.made.exit_code = 7",
                "where vars.made.stdout = \"hi\\n\"",
                "where vars.made.stdout | trim = \"hi\""
            ]
        );
        let long = &where_lines("long == 'y'", &ctx)[0];
        assert!(long.ends_with("…") && long.chars().count() < MAX_SHOWN + 20, "{long}");
        assert_eq!(where_lines("vars.nope == 1", &ctx), ["where vars.nope = undefined"]);
    }
}
