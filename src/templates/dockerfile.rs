//! The Dockerfile subset a template may use, parsed with positions.
//!
//! Supported: `FROM`, `ARG`, `RUN` (shell and exec form), `COPY` (files and directories from
//! the template folder; `--chown`/`--chmod` are accepted and ignored with a note), `ENV`
//! (`k=v …` and the legacy `k v`), `WORKDIR`, `USER`, `CMD`, `EXPOSE`; `\` line continuations,
//! `#` comment lines (also inside a continuation) and parser directives (read as comments).
//! One build stage: a second `FROM`, `COPY --from` and `RUN --mount` are errors, as is any
//! other instruction. Every error names its line and column.
//!
//! Words are kept unexpanded ([`Word`]): `$VAR`, `${VAR}`, `${VAR:-default}` and
//! `${VAR:+alt}` are substituted when the build runs (from the ARG and ENV values in force at
//! that instruction), as Docker does for FROM, COPY, ENV, WORKDIR, USER and EXPOSE. RUN and
//! CMD are left to the shell, which sees the ARGs and ENVs in its environment.

use std::collections::BTreeMap;
use std::fmt;

/// A parse error at a 1-based line and column of the Dockerfile.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    pub line: u32,
    pub col: u32,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.col, self.message)
    }
}

/// One piece of a word: literal text, or a variable reference.
#[derive(Debug, Clone, PartialEq)]
pub enum Seg {
    Lit(String),
    /// `$NAME`/`${NAME}`; `modifier` is `-` (default) or `+` (alternative) with its word.
    Var {
        name: String,
        modifier: Option<(char, Box<Word>)>,
    },
}

/// A word after quote removal, with its variable references still in place.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Word(pub Vec<Seg>);

impl Word {
    /// Substitutes variables from `vars` (unset ones become empty).
    pub fn expand(&self, vars: &BTreeMap<String, String>) -> String {
        let mut out = String::new();
        for seg in &self.0 {
            match seg {
                Seg::Lit(s) => out.push_str(s),
                Seg::Var { name, modifier } => {
                    let val = vars.get(name).map(String::as_str);
                    match modifier {
                        None => out.push_str(val.unwrap_or("")),
                        Some(('-', w)) => match val {
                            Some(v) if !v.is_empty() => out.push_str(v),
                            _ => out.push_str(&w.expand(vars)),
                        },
                        Some((_, w)) => {
                            if val.is_some_and(|v| !v.is_empty()) {
                                out.push_str(&w.expand(vars));
                            }
                        }
                    }
                }
            }
        }
        out
    }

    fn lit(s: &str) -> Self {
        Word(vec![Seg::Lit(s.to_string())])
    }

    /// The word split at its first literal `=`: (name, value).
    fn split_eq(&self) -> Option<(String, Word)> {
        let mut name = String::new();
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Lit(s) => {
                    if let Some(p) = s.find('=') {
                        name.push_str(&s[..p]);
                        let mut rest = vec![Seg::Lit(s[p + 1..].to_string())];
                        rest.extend(self.0[i + 1..].iter().cloned());
                        return Some((name, Word(rest)));
                    }
                    name.push_str(s);
                }
                Seg::Var { .. } => return None,
            }
        }
        None
    }
}

/// How RUN and CMD give their command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `RUN apt-get update && …`: run by a shell.
    Shell(String),
    /// `RUN ["pip", "install", "x"]`: argv, no shell.
    Exec(Vec<String>),
}

impl Command {
    /// The command as one shell command line (exec form is quoted word by word).
    pub fn shell_line(&self) -> String {
        match self {
            Command::Shell(s) => s.clone(),
            Command::Exec(argv) => argv.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "),
        }
    }
}

/// Quotes `s` for a POSIX shell (as it is, when nothing needs quoting).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%^".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Inst {
    From { image: Word },
    Arg { name: String, default: Option<Word> },
    Run(Command),
    Copy { sources: Vec<Word>, dest: Word, ignored_flags: Vec<String> },
    Env(Vec<(String, Word)>),
    Workdir(Word),
    User(Word),
    Cmd(Command),
    Expose(Vec<Word>),
}

impl Inst {
    pub fn keyword(&self) -> &'static str {
        match self {
            Inst::From { .. } => "FROM",
            Inst::Arg { .. } => "ARG",
            Inst::Run(_) => "RUN",
            Inst::Copy { .. } => "COPY",
            Inst::Env(_) => "ENV",
            Inst::Workdir(_) => "WORKDIR",
            Inst::User(_) => "USER",
            Inst::Cmd(_) => "CMD",
            Inst::Expose(_) => "EXPOSE",
        }
    }
}

/// One instruction and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Instruction {
    pub line: u32,
    pub inst: Inst,
    /// The instruction as written (continuations joined), for build logs.
    pub text: String,
}

/// A parsed Dockerfile: the instructions in order (ARGs before FROM included).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dockerfile {
    pub instructions: Vec<Instruction>,
}

impl Dockerfile {
    /// The `FROM` instruction's image word.
    pub fn from(&self) -> Option<&Word> {
        self.instructions.iter().find_map(|i| match &i.inst {
            Inst::From { image } => Some(image),
            _ => None,
        })
    }
}

pub const SUPPORTED: &str = "FROM, ARG, RUN, COPY, ENV, WORKDIR, USER, CMD, EXPOSE";

/// Parses the supported subset; all errors are returned, each with its position.
pub fn parse(text: &str) -> Result<Dockerfile, Vec<ParseError>> {
    let mut errors = Vec::new();
    let mut out = Dockerfile::default();
    let mut seen_from = false;
    for logical in logical_lines(text) {
        match parse_instruction(&logical) {
            Ok(inst) => {
                match &inst {
                    Inst::From { .. } if seen_from => errors.push(
                        logical.err(1, "a second FROM: multi-stage builds are not supported (one stage per template)"),
                    ),
                    Inst::From { .. } => seen_from = true,
                    Inst::Arg { .. } => {}
                    other if !seen_from => errors
                        .push(logical.err(1, format!("{} before FROM (only ARG may come first)", other.keyword()))),
                    _ => {}
                }
                out.instructions.push(Instruction { line: logical.line, inst, text: logical.joined() });
            }
            Err(e) => errors.push(e),
        }
    }
    if !seen_from && errors.is_empty() {
        errors.push(ParseError { line: 1, col: 1, message: "no FROM instruction".into() });
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// An instruction's text after joining continuations, with a map back to source positions.
struct Logical {
    line: u32,
    /// (text of one physical piece, its line, column where the piece starts).
    pieces: Vec<(String, u32, u32)>,
}

impl Logical {
    fn joined(&self) -> String {
        self.pieces.iter().map(|p| p.0.as_str()).collect::<Vec<_>>().join(" ")
    }

    /// Source position of byte `offset` in [`Logical::joined`] (pieces are joined by one space).
    fn pos(&self, offset: usize) -> (u32, u32) {
        let mut start = 0;
        for (text, line, col) in &self.pieces {
            if offset <= start + text.len() {
                // Characters before the byte offset, counted without slicing: an offset inside
                // a multi-byte character must not panic.
                let within = text.char_indices().take_while(|(i, _)| *i < offset - start).count() as u32;
                return (*line, col + within);
            }
            start += text.len() + 1;
        }
        let (_, line, col) = self.pieces.last().cloned().unwrap_or_default();
        (line, col)
    }

    fn err(&self, offset_plus_one: usize, message: impl Into<String>) -> ParseError {
        let (line, col) = self.pos(offset_plus_one.saturating_sub(1));
        ParseError { line, col, message: message.into() }
    }
}

fn logical_lines(text: &str) -> Vec<Logical> {
    let mut out = Vec::new();
    let mut cur: Option<Logical> = None;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i as u32 + 1;
        let trimmed = raw.trim_start();
        let indent = (raw.len() - trimmed.len()) as u32;
        if trimmed.starts_with('#') || (trimmed.is_empty() && cur.is_some()) {
            // Comments (and blank lines) inside a continuation are dropped, as Docker does.
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        let body = trimmed.trim_end();
        let (body, continues) = match body.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (body, false),
        };
        let logical = cur.get_or_insert_with(|| Logical { line: line_no, pieces: Vec::new() });
        logical.pieces.push((body.to_string(), line_no, indent + 1));
        if !continues {
            out.push(cur.take().expect("just set"));
        }
    }
    if let Some(l) = cur {
        out.push(l);
    }
    out
}

fn parse_instruction(l: &Logical) -> Result<Inst, ParseError> {
    let text = l.joined();
    let kw_end = text.find(char::is_whitespace).unwrap_or(text.len());
    let keyword = text[..kw_end].to_ascii_uppercase();
    let rest_start = text[kw_end..].find(|c: char| !c.is_whitespace()).map_or(text.len(), |p| kw_end + p);
    let rest = &text[rest_start..];
    let at = |off: usize, msg: String| l.err(rest_start + off + 1, msg);
    let need_args = || {
        if rest.is_empty() {
            Err(l.err(1, format!("{keyword} needs an argument")))
        } else {
            Ok(())
        }
    };
    match keyword.as_str() {
        "FROM" => {
            need_args()?;
            let words = lex(rest).map_err(|(o, m)| at(o, m))?;
            if words.len() != 1 {
                return Err(at(
                    0,
                    format!("FROM takes one image (got `{rest}`); stages and --platform are not supported"),
                ));
            }
            Ok(Inst::From { image: words.into_iter().next().unwrap_or_default() })
        }
        "ARG" => {
            need_args()?;
            let words = lex(rest).map_err(|(o, m)| at(o, m))?;
            if words.len() != 1 {
                return Err(at(0, "ARG takes one `name` or `name=default`".into()));
            }
            let (name, default) = match words[0].split_eq() {
                Some((n, v)) => (n, Some(v)),
                None => (words[0].expand(&BTreeMap::new()), None),
            };
            check_name(&name).map_err(|e| at(0, e.to_string()))?;
            Ok(Inst::Arg { name, default })
        }
        "RUN" => {
            need_args()?;
            if rest.starts_with("--") {
                let flag = rest.split_whitespace().next().unwrap_or(rest);
                return Err(at(0, format!("RUN flag `{flag}` is not supported")));
            }
            Ok(Inst::Run(command(rest).map_err(|(o, m)| at(o, m))?))
        }
        "CMD" => {
            need_args()?;
            Ok(Inst::Cmd(command(rest).map_err(|(o, m)| at(o, m))?))
        }
        "COPY" => {
            need_args()?;
            if rest.starts_with('[') {
                return Err(at(0, "COPY in JSON form is not supported; write `COPY src… dest`".into()));
            }
            let mut words = lex(rest).map_err(|(o, m)| at(o, m))?;
            let mut ignored = Vec::new();
            while let Some(first) = words.first() {
                let s = first.expand(&BTreeMap::new());
                if !s.starts_with("--") {
                    break;
                }
                let name = s.split('=').next().unwrap_or(&s).to_string();
                match name.as_str() {
                    "--chown" | "--chmod" | "--link" => ignored.push(s),
                    "--from" => {
                        return Err(at(0, "COPY --from needs multi-stage builds, which are not supported".into()))
                    }
                    _ => return Err(at(0, format!("COPY flag `{name}` is not supported"))),
                }
                words.remove(0);
            }
            if words.len() < 2 {
                return Err(at(0, "COPY needs at least one source and a destination".into()));
            }
            let dest = words.pop().expect("len >= 2");
            Ok(Inst::Copy { sources: words, dest, ignored_flags: ignored })
        }
        "ENV" => {
            need_args()?;
            let words = lex(rest).map_err(|(o, m)| at(o, m))?;
            let mut pairs = Vec::new();
            if words[0].split_eq().is_none() {
                // Legacy `ENV name value with spaces`.
                let name = words[0].expand(&BTreeMap::new());
                check_name(&name).map_err(|e| at(0, e.to_string()))?;
                let value_start = rest.find(char::is_whitespace).map(|p| p + 1).unwrap_or(rest.len());
                let value = rest[value_start..].trim_start();
                if value.is_empty() {
                    return Err(at(0, format!("ENV {name} has no value (write `ENV {name}=value`)")));
                }
                pairs.push((name, Word::lit(value)));
            } else {
                for w in words {
                    let Some((name, value)) = w.split_eq() else {
                        return Err(at(0, "ENV mixes `name=value` with a bare word".into()));
                    };
                    check_name(&name).map_err(|e| at(0, e.to_string()))?;
                    pairs.push((name, value));
                }
            }
            Ok(Inst::Env(pairs))
        }
        "WORKDIR" | "USER" => {
            need_args()?;
            let mut words = lex(rest).map_err(|(o, m)| at(o, m))?;
            if words.len() != 1 {
                return Err(at(0, format!("{keyword} takes one argument")));
            }
            let w = words.remove(0);
            Ok(if keyword == "WORKDIR" { Inst::Workdir(w) } else { Inst::User(w) })
        }
        "EXPOSE" => {
            need_args()?;
            Ok(Inst::Expose(lex(rest).map_err(|(o, m)| at(o, m))?))
        }
        "" => Err(l.err(1, "empty instruction")),
        other => {
            let (line, col) = l.pos(0);
            Err(ParseError { line, col, message: format!("unsupported instruction {other} (supported: {SUPPORTED})") })
        }
    }
}

/// An ARG or ENV name that is not letters, digits and `_` (not starting with a digit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid variable name `{0}`")]
struct InvalidName(String);

fn check_name(name: &str) -> Result<(), InvalidName> {
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(InvalidName(name.to_string()))
    }
}

/// Shell or exec form. Text starting with `[` must be a JSON array of strings.
fn command(rest: &str) -> Result<Command, (usize, String)> {
    if rest.starts_with('[') {
        return match serde_json::from_str::<Vec<String>>(rest) {
            Ok(argv) if !argv.is_empty() => Ok(Command::Exec(argv)),
            Ok(_) => Err((0, "the exec form is an empty list".into())),
            Err(e) => Err((0, format!("the exec form must be a JSON array of strings: {e}"))),
        };
    }
    Ok(Command::Shell(rest.to_string()))
}

/// Splits into words: whitespace separates, `'…'` is literal, `"…"` allows `$` and `\"`,
/// `\` escapes one character, `$NAME` and `${…}` are variable references. Errors carry the
/// byte offset in `s`.
fn lex(s: &str) -> Result<Vec<Word>, (usize, String)> {
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let mut words = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        while i < chars.len() && chars[i].1.is_whitespace() {
            i += 1;
        }
        if i >= chars.len() {
            break;
        }
        let mut segs = Vec::new();
        let mut lit = String::new();
        while i < chars.len() && !chars[i].1.is_whitespace() {
            let (off, c) = chars[i];
            match c {
                '\'' => {
                    i += 1;
                    loop {
                        let Some(&(_, c)) = chars.get(i) else { return Err((off, "unterminated '".into())) };
                        i += 1;
                        if c == '\'' {
                            break;
                        }
                        lit.push(c);
                    }
                }
                '"' => {
                    i += 1;
                    loop {
                        let Some(&(_, c)) = chars.get(i) else { return Err((off, "unterminated \"".into())) };
                        match c {
                            '"' => {
                                i += 1;
                                break;
                            }
                            '\\' if matches!(chars.get(i + 1), Some((_, '"' | '\\' | '$'))) => {
                                lit.push(chars[i + 1].1);
                                i += 2;
                            }
                            '$' => {
                                flush(&mut segs, &mut lit);
                                i = var(&chars, i, &mut segs)?;
                            }
                            _ => {
                                lit.push(c);
                                i += 1;
                            }
                        }
                    }
                }
                '\\' => {
                    if let Some(&(_, n)) = chars.get(i + 1) {
                        lit.push(n);
                    }
                    i += 2;
                }
                '$' => {
                    flush(&mut segs, &mut lit);
                    i = var(&chars, i, &mut segs)?;
                }
                _ => {
                    lit.push(c);
                    i += 1;
                }
            }
        }
        flush(&mut segs, &mut lit);
        words.push(Word(segs));
    }
    Ok(words)
}

fn flush(segs: &mut Vec<Seg>, lit: &mut String) {
    if !lit.is_empty() {
        segs.push(Seg::Lit(std::mem::take(lit)));
    }
}

/// Reads a variable reference starting at the `$` at `i`; returns the index after it.
fn var(chars: &[(usize, char)], i: usize, segs: &mut Vec<Seg>) -> Result<usize, (usize, String)> {
    let off = chars[i].0;
    let ident = |j: usize| -> (String, usize) {
        let mut name = String::new();
        let mut j = j;
        while let Some(&(_, c)) = chars.get(j) {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                j += 1;
            } else {
                break;
            }
        }
        (name, j)
    };
    match chars.get(i + 1) {
        Some((_, '{')) => {
            let (name, mut j) = ident(i + 2);
            if name.is_empty() {
                return Err((off, "bad variable reference: expected a name after ${".into()));
            }
            let mut modifier = None;
            if let (Some((_, ':')), Some(&(_, m))) = (chars.get(j), chars.get(j + 1)) {
                if m == '-' || m == '+' {
                    let start = j + 2;
                    let mut depth = 0;
                    let mut k = start;
                    loop {
                        match chars.get(k) {
                            None => return Err((off, "unterminated ${".into())),
                            Some((_, '{')) => depth += 1,
                            Some((_, '}')) if depth == 0 => break,
                            Some((_, '}')) => depth -= 1,
                            _ => {}
                        }
                        k += 1;
                    }
                    let inner: String = chars[start..k].iter().map(|c| c.1).collect();
                    let word =
                        lex(&inner).map_err(|(_, m)| (off, m))?.into_iter().fold(Word::default(), |mut acc, w| {
                            if !acc.0.is_empty() {
                                acc.0.push(Seg::Lit(" ".into()));
                            }
                            acc.0.extend(w.0);
                            acc
                        });
                    modifier = Some((m, Box::new(word)));
                    j = k;
                } else {
                    return Err((off, format!("unsupported variable modifier `:{m}` (use :- or :+)")));
                }
            }
            if !matches!(chars.get(j), Some((_, '}'))) {
                return Err((off, "unterminated ${".into()));
            }
            segs.push(Seg::Var { name, modifier });
            Ok(j + 1)
        }
        _ => {
            let (name, j) = ident(i + 1);
            if name.is_empty() {
                segs.push(Seg::Lit("$".into()));
                Ok(i + 1)
            } else {
                segs.push(Seg::Var { name, modifier: None });
                Ok(j)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn one_error(text: &str) -> ParseError {
        let errs = parse(text).unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        errs.into_iter().next().unwrap()
    }

    #[test]
    fn parses_the_supported_instructions() {
        let df = parse(
            "# syntax=docker/dockerfile:1\nARG BASE_IMAGE=python:3.11-slim\nFROM ${BASE_IMAGE}\n\
             RUN pip install x \\\n    # a comment inside\n    && echo done\n\
             RUN [\"echo\", \"a b\"]\nCOPY --chown=user:user app/ a.txt /app/\n\
             ENV A=1 B=\"two words\" C=$A\nENV LEGACY some value\nWORKDIR /app\nUSER user\n\
             EXPOSE 9000 3000\nCMD [\"python3\", \"x.py\"]\n",
        )
        .unwrap();
        let kinds: Vec<&str> = df.instructions.iter().map(|i| i.inst.keyword()).collect();
        assert_eq!(kinds, ["ARG", "FROM", "RUN", "RUN", "COPY", "ENV", "ENV", "WORKDIR", "USER", "EXPOSE", "CMD"]);
        assert_eq!(df.instructions[2].line, 4);
        assert_eq!(df.instructions[2].inst, Inst::Run(Command::Shell("pip install x && echo done".into())));
        assert_eq!(df.instructions[3].inst, Inst::Run(Command::Exec(vec!["echo".into(), "a b".into()])));
        assert_eq!(df.instructions[3].line, 7);
        let Inst::Copy { sources, dest, ignored_flags } = &df.instructions[4].inst else { panic!() };
        assert_eq!(sources.len(), 2);
        assert_eq!(dest.expand(&BTreeMap::new()), "/app/");
        assert_eq!(ignored_flags, &["--chown=user:user"]);
        let Inst::Env(pairs) = &df.instructions[5].inst else { panic!() };
        let v = vars(&[("A", "1")]);
        let got: Vec<(String, String)> = pairs.iter().map(|(k, w)| (k.clone(), w.expand(&v))).collect();
        assert_eq!(got, [("A".into(), "1".into()), ("B".into(), "two words".into()), ("C".into(), "1".into())]);
        let Inst::Env(legacy) = &df.instructions[6].inst else { panic!() };
        assert_eq!(legacy[0].1.expand(&v), "some value");
        assert_eq!(df.from().unwrap().expand(&vars(&[("BASE_IMAGE", "debian")])), "debian");
    }

    #[test]
    fn substitution_forms() {
        let words = lex("${A:-dflt} ${B:+alt} $A/x '$A' \"$A\"\\$").unwrap();
        let v = vars(&[("A", "a"), ("B", "")]);
        let got: Vec<String> = words.iter().map(|w| w.expand(&v)).collect();
        assert_eq!(got, ["a", "", "a/x", "$A", "a$"]);
        assert_eq!(words[0].expand(&BTreeMap::new()), "dflt");
        assert_eq!(words[1].expand(&vars(&[("B", "set")])), "alt");
    }

    #[test]
    fn exec_form_becomes_a_quoted_shell_line() {
        let c = Command::Exec(vec!["python3".into(), "-c".into(), "print('hi')".into()]);
        assert_eq!(c.shell_line(), "python3 -c 'print('\\''hi'\\'')'");
    }

    #[test]
    fn errors_point_at_line_and_column() {
        let e = one_error("FROM x\nRUN echo ok\n  ADD a b\n");
        assert_eq!((e.line, e.col), (3, 3));
        assert!(e.message.contains("unsupported instruction ADD"), "{}", e.message);

        let e = one_error("FROM x\nRUN echo a \\\n  && echo b\nCMD [\"a\", 1]\n");
        assert_eq!((e.line, e.col), (4, 5));
        assert!(e.message.contains("JSON array of strings"), "{}", e.message);

        let e = one_error("FROM x\nENV A=\"unterminated\n");
        assert_eq!((e.line, e.col), (2, 7));
        assert!(e.message.contains("unterminated"), "{}", e.message);

        let e = one_error("RUN echo\nFROM x\n");
        assert_eq!(e.line, 1);
        assert!(e.message.contains("RUN before FROM"), "{}", e.message);

        let e = one_error("FROM a\nFROM b\n");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("multi-stage"), "{}", e.message);

        let e = one_error("FROM x\nCOPY --from=build /a /b\n");
        assert_eq!((e.line, e.col), (2, 6));

        let e = one_error("FROM x\nCOPY onlyone\n");
        assert!(e.message.contains("source and a destination"), "{}", e.message);

        let e = one_error("ARG X\n");
        assert!(e.message.contains("no FROM"), "{}", e.message);

        let errs = parse("FROM x\nLABEL a=b\nHEALTHCHECK NONE\n").unwrap_err();
        assert_eq!(errs.iter().map(|e| e.line).collect::<Vec<_>>(), [2, 3], "all errors at once");
    }

    #[test]
    fn shipped_dockerfiles_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path().join("Dockerfile");
            if let Ok(text) = std::fs::read_to_string(&p) {
                parse(&text).unwrap_or_else(|e| panic!("{}: {e:?}", p.display()));
                n += 1;
            }
        }
        assert!(n >= 12, "only {n} Dockerfiles");
    }
}
