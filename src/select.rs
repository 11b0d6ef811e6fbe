//! Selection: `-k` name expressions, `-t` tag expressions, and `--shard K/N`.
//!
//! Both expression kinds share one tiny grammar: `a and not (b or c)`. For `-t` a word is a
//! tag; for `-k` a word matches when it is a substring of the scenario name, ignoring letter
//! case (as in pytest). Names have spaces, so a quoted phrase (`"exit codes"` or `'exit
//! codes'`) is one word; `and`, `or` and `not` are operators in any case (`AND`), except quoted.

use crate::model::Case;

/// What `-k`, `-t` and `--shard` select, parsed once.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    name: Option<(String, Expr)>,
    tags: Option<(String, Expr)>,
    shard: Option<Shard>,
}

impl Selection {
    /// From the flags' text; a bad expression is an error naming its flag.
    pub fn new(name: Option<&str>, tags: Option<&str>, shard: Option<Shard>) -> Result<Self, String> {
        let parse = |flag: &str, text: Option<&str>| {
            text.map(|t| Expr::parse(t).map(|e| (t.to_string(), e)).map_err(|e| with_hint(flag, t, e))).transpose()
        };
        Ok(Selection { name: parse("-k", name)?, tags: parse("--tags", tags)?, shard })
    }

    /// Whether the case is selected: its name matches `-k`, its tags `-t`, and it is in the shard.
    pub fn selects(&self, case: &Case) -> bool {
        let name = case.name.to_lowercase();
        self.name.as_ref().is_none_or(|(_, e)| e.eval(&|w| name.contains(&w.to_lowercase())))
            && self.tags.as_ref().is_none_or(|(_, e)| e.eval(&|w| case.scenario.tags.iter().any(|t| t == w)))
            && self.shard.is_none_or(|s| s.contains(&case.name))
    }

    /// The selected cases, in their order.
    pub fn apply(&self, cases: Vec<Case>) -> Vec<Case> {
        cases.into_iter().filter(|c| self.selects(c)).collect()
    }

    /// The filters as flags, for "no scenario matches -k 'x' --shard 1/2".
    pub fn describe(&self) -> String {
        let mut filters = Vec::new();
        if let Some((k, _)) = &self.name {
            filters.push(format!("-k '{k}'"));
        }
        if let Some((t, _)) = &self.tags {
            filters.push(format!("-t '{t}'"));
        }
        if let Some(s) = &self.shard {
            filters.push(format!("--shard {}/{}", s.index, s.count));
        }
        filters.join(" ")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Word(String),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

impl Expr {
    pub fn parse(text: &str) -> Result<Expr, String> {
        let tokens = tokenize(text)?;
        if tokens.is_empty() {
            return Err("empty expression".into());
        }
        // The parser, `eval` and the drop of the tree all recurse: bounded, so no input can
        // overflow the stack.
        if tokens.len() > MAX_TOKENS {
            return Err(format!("expression too long: {} words and parentheses, at most {MAX_TOKENS}", tokens.len()));
        }
        let mut p = TagParser { tokens, pos: 0, depth: 0 };
        let e = p.or()?;
        if let Some(t) = p.tokens.get(p.pos) {
            return Err(format!("unexpected `{}` in `{text}`", t.text));
        }
        Ok(e)
    }

    pub fn eval(&self, word: &dyn Fn(&str) -> bool) -> bool {
        match self {
            Expr::Word(w) => word(w),
            Expr::Not(e) => !e.eval(word),
            Expr::And(a, b) => a.eval(word) && b.eval(word),
            Expr::Or(a, b) => a.eval(word) || b.eval(word),
        }
    }
}

/// `-k: …`, and when the expression is words with spaces but no operator (`exit codes`), what
/// was probably meant: both words, or the phrase.
fn with_hint(flag: &str, text: &str, error: String) -> String {
    let short = if flag == "--tags" { "-t" } else { flag };
    let tokens = tokenize(text).unwrap_or_default();
    if tokens.len() < 2 || tokens.iter().any(|t| t.symbol().is_some()) {
        return format!("{short}: {error}");
    }
    let quoted = tokens.iter().any(|t| t.quoted);
    let words: Vec<String> =
        tokens.iter().map(|t| if t.quoted { format!("\"{}\"", t.text) } else { t.text.clone() }).collect();
    let count = match words.len() {
        2 => "two words".to_string(),
        n => format!("{n} words"),
    };
    let mut hint = format!(
        "{short}: `{text}` is {count} with no `and` or `or` between them\n  = help: `{short} '{}'` selects {} with {} words",
        words.join(" and "),
        if short == "-t" { "scenarios tagged" } else { "names" },
        if words.len() == 2 { "both" } else { "all the" }
    );
    if short == "-k" && !quoted {
        hint.push_str(&format!("; `-k '\"{}\"'` selects names with the phrase", words.join(" ")));
    }
    hint
}

/// A word, an operator or a parenthesis of an expression.
#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    /// Written in quotes: a word, whatever it says (`"not found"`, `'and'`).
    quoted: bool,
}

impl Token {
    /// `and`, `or` or `not`, in any letter case, unless quoted.
    fn op(&self) -> Option<&'static str> {
        if self.quoted {
            return None;
        }
        ["and", "or", "not"].into_iter().find(|op| self.text.eq_ignore_ascii_case(op))
    }

    /// What the parser reads: `(`, `)`, an operator, or `None` for a word.
    fn symbol(&self) -> Option<&str> {
        if self.quoted {
            return None;
        }
        match self.text.as_str() {
            "(" | ")" => Some(self.text.as_str()),
            _ => self.op(),
        }
    }
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars();
    let flush = |cur: &mut String, out: &mut Vec<Token>| {
        if !cur.is_empty() {
            out.push(Token { text: std::mem::take(cur), quoted: false });
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' if cur.is_empty() => {
                let mut phrase = String::new();
                let mut closed = false;
                for q in chars.by_ref() {
                    if q == c {
                        closed = true;
                        break;
                    }
                    phrase.push(q);
                }
                if !closed {
                    return Err(format!("missing closing {c} in `{text}`"));
                }
                if phrase.is_empty() {
                    return Err(format!("empty quotes in `{text}`"));
                }
                out.push(Token { text: phrase, quoted: true });
            }
            '(' | ')' => {
                flush(&mut cur, &mut out);
                out.push(Token { text: c.to_string(), quoted: false });
            }
            c if c.is_whitespace() => flush(&mut cur, &mut out),
            c => cur.push(c),
        }
    }
    flush(&mut cur, &mut out);
    Ok(out)
}

/// The most words, operators and parentheses in one expression; `a and b and …` nests one
/// level per `and`, so this bounds the tree's depth too.
const MAX_TOKENS: usize = 1000;
/// The deepest nesting of parentheses and `not`.
const MAX_DEPTH: usize = 64;

/// A recursive-descent parser over the tokens of a `-t` tag expression.
struct TagParser {
    tokens: Vec<Token>,
    pos: usize,
    /// Parentheses and `not`s open around the current token.
    depth: usize,
}

impl TagParser {
    /// The next token's symbol: `Some("(")`, `Some("and")`, …, `Some("")` for a word.
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.pos).map(|t| t.symbol().unwrap_or(""))
    }
    fn or(&mut self) -> Result<Expr, String> {
        let mut left = self.and()?;
        while self.peek() == Some("or") {
            self.pos += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }
    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.not()?;
        while self.peek() == Some("and") {
            self.pos += 1;
            left = Expr::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }
    fn deeper(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!(
                "expression nested too deep: more than {MAX_DEPTH} parentheses and `not`s inside each other"
            ));
        }
        Ok(())
    }
    fn not(&mut self) -> Result<Expr, String> {
        if self.peek() == Some("not") {
            self.pos += 1;
            self.deeper()?;
            let e = Expr::Not(Box::new(self.not()?));
            self.depth -= 1;
            return Ok(e);
        }
        self.atom()
    }
    fn atom(&mut self) -> Result<Expr, String> {
        match self.peek() {
            Some("(") => {
                self.pos += 1;
                self.deeper()?;
                let e = self.or()?;
                if self.peek() != Some(")") {
                    return Err("missing `)`".into());
                }
                self.pos += 1;
                self.depth -= 1;
                Ok(e)
            }
            Some(")" | "and" | "or") => Err(format!("unexpected `{}`", self.tokens[self.pos].text)),
            Some(_) => {
                let w = self.tokens[self.pos].text.clone();
                self.pos += 1;
                Ok(Expr::Word(w))
            }
            None => Err("expression ends too early".into()),
        }
    }
}

/// `--shard K/N` (1-based K).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (k, n) = s.split_once('/').ok_or_else(|| format!("expected K/N, got `{s}`"))?;
        let index: u64 = k.trim().parse().map_err(|_| format!("bad shard index `{k}`"))?;
        let count: u64 = n.trim().parse().map_err(|_| format!("bad shard count `{n}`"))?;
        if count == 0 || index == 0 || index > count {
            return Err(format!("shard must satisfy 1 <= K <= N, got {index}/{count}"));
        }
        Ok(Shard { index, count })
    }
}

impl Shard {
    /// Stable across machines and runs: FNV-1a of the scenario name, never the file order or
    /// a randomly seeded hasher.
    pub fn contains(&self, name: &str) -> bool {
        let mut h: u64 = 0xcbf29ce484222325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
        h % self.count == self.index - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(expr: &str, tags: &[&str]) -> bool {
        Expr::parse(expr).unwrap().eval(&|w| tags.contains(&w))
    }

    #[test]
    fn boolean_tag_expressions() {
        assert!(tags("commands and not slow", &["commands", "fast"]));
        assert!(!tags("commands and not slow", &["commands", "slow"]));
        assert!(tags("files or (commands and slow)", &["commands", "slow"]));
        assert!(!tags("not (a or b)", &["b"]));
    }

    #[test]
    fn bad_expressions_are_errors() {
        assert!(Expr::parse("a and").is_err());
        assert!(Expr::parse("(a").is_err());
        assert!(Expr::parse("a b").is_err());
        assert!(Expr::parse("").is_err());
    }

    /// Issue 27 item 5: a quoted phrase is one word, operators are such in any case unless
    /// quoted, and a quote left open is an error that says so.
    #[test]
    fn quoted_phrases_and_operators_in_any_case() {
        let names = |expr: &str, name: &str| Expr::parse(expr).unwrap().eval(&|w| name.contains(w));
        assert!(names("\"exit codes\"", "commands exit codes"));
        assert!(!names("\"exit codes\"", "exit and codes"));
        assert!(names("'and' AND codes", "exit and codes"), "a quoted operator is a word");
        assert!(names("exit AND NOT stdin", "exit codes"));
        assert_eq!(Expr::parse("\"exit codes").unwrap_err(), "missing closing \" in `\"exit codes`");
        assert!(Expr::parse("''").unwrap_err().contains("empty quotes"));
    }

    /// Issue 26 item 15: `((((…` overflowed the stack.
    #[test]
    fn nesting_and_length_are_bounded() {
        let ok = format!("{}a{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        assert!(Expr::parse(&ok).is_ok());
        let deep = format!("{}a{}", "(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
        assert!(Expr::parse(&deep).unwrap_err().contains("nested too deep"));
        let nots = "not ".repeat(MAX_DEPTH + 1) + "a";
        assert!(Expr::parse(&nots).unwrap_err().contains("nested too deep"));
        // Depth is what is open at once, not how many there are.
        let many = vec!["(a)"; 200].join(" or ");
        assert!(Expr::parse(&many).is_ok());
        let long = vec!["a"; MAX_TOKENS].join(" and ");
        assert!(Expr::parse(&long).unwrap_err().contains("too long"));
    }

    #[test]
    fn shards_partition_and_are_stable() {
        let names: Vec<String> = (0..200).map(|i| format!("scenario {i}")).collect();
        let shards: Vec<Shard> = (1..=3).map(|k| format!("{k}/3").parse().unwrap()).collect();
        for n in &names {
            assert_eq!(shards.iter().filter(|s| s.contains(n)).count(), 1);
        }
        // Pinned to the FNV-1a test vectors: changing the hash would reshuffle every CI matrix.
        let which: Vec<u64> = ["a", "b", "c"]
            .iter()
            .map(|n| (1..=4).find(|k| Shard { index: *k, count: 4 }.contains(n)).unwrap())
            .collect();
        assert_eq!(which, vec![which_fnv("a"), which_fnv("b"), which_fnv("c")]);
        assert!("0/3".parse::<Shard>().is_err());
        assert!("4/3".parse::<Shard>().is_err());
    }

    #[allow(clippy::identity_op)]
    fn which_fnv(name: &str) -> u64 {
        // FNV-1a 64-bit test vectors for "a", "b", "c".
        match name {
            "a" => 0xaf63dc4c8601ec8c % 4 + 1,
            "b" => 0xaf63df4c8601f1a5 % 4 + 1,
            "c" => 0xaf63de4c8601eff2 % 4 + 1,
            _ => unreachable!(),
        }
    }
}
