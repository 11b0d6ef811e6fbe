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
    pub fn new(name: Option<&str>, tags: Option<&str>, shard: Option<Shard>) -> Result<Self, SelectError> {
        let parse = |flag: Flag, text: Option<&str>| {
            text.map(|t| {
                Expr::parse(t).map(|e| (t.to_string(), e)).map_err(|error| SelectError {
                    flag,
                    text: t.to_string(),
                    error,
                })
            })
            .transpose()
        };
        Ok(Selection { name: parse(Flag::Name, name)?, tags: parse(Flag::Tags, tags)?, shard })
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

    /// The words of `-t` that no loaded case carries as a tag, each with a did-you-mean from
    /// the tags they do carry (or the list of them): `unknown tag `fsat`: did you mean `fast`?`.
    pub fn unknown_tags(&self, cases: &[Case]) -> Vec<String> {
        let Some((_, expr)) = &self.tags else { return Vec::new() };
        let mut known: Vec<&str> = cases.iter().flat_map(|c| c.scenario.tags.iter().map(String::as_str)).collect();
        known.sort_unstable();
        known.dedup();
        let mut words = Vec::new();
        expr.words(&mut words);
        let mut out: Vec<String> = Vec::new();
        for w in words {
            if known.contains(&w) || out.iter().any(|o| o.contains(&format!("`{w}`"))) {
                continue;
            }
            out.push(match crate::diag::did_you_mean(w, known.iter().copied()) {
                Some(m) => format!("unknown tag `{w}`: did you mean `{m}`?"),
                None if known.is_empty() => format!("unknown tag `{w}`: no scenario loaded has tags"),
                None => format!("unknown tag `{w}`: the tags are {}", known.join(", ")),
            });
        }
        out
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

/// The flag whose expression was bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// `-k`: words of the scenario name.
    Name,
    /// `-t`/`--tags`: tags.
    Tags,
}

impl Flag {
    /// As the messages name it: `-k` or `-t`.
    fn short(self) -> &'static str {
        match self {
            Flag::Name => "-k",
            Flag::Tags => "-t",
        }
    }
}

/// A `-k` or `-t` expression that does not parse. Displays as `-k: …`, with a hint when the
/// expression is words with spaces but no operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectError {
    pub flag: Flag,
    /// The expression as written.
    pub text: String,
    pub error: ExprError,
}

impl std::fmt::Display for SelectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&with_hint(self.flag, &self.text, &self.error))
    }
}

impl std::error::Error for SelectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Why an expression does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExprError {
    #[error("empty expression")]
    Empty,
    #[error("expression too long: {tokens} words and parentheses, at most {max}", max = MAX_TOKENS)]
    TooLong { tokens: usize },
    #[error("expression nested too deep: more than {max} parentheses and `not`s inside each other", max = MAX_DEPTH)]
    TooDeep,
    #[error("missing closing {quote} in `{text}`")]
    UnclosedQuote { quote: char, text: String },
    #[error("empty quotes in `{text}`")]
    EmptyQuotes { text: String },
    #[error("missing `)`")]
    MissingParen,
    /// An operator or `)` where a word belongs.
    #[error("unexpected `{token}`")]
    Unexpected { token: String },
    /// A token left over after a whole expression (`a b`).
    #[error("unexpected `{token}` in `{text}`")]
    Trailing { token: String, text: String },
    #[error("expression ends too early")]
    EndsEarly,
    /// `&&`, `||` or `!` (C's, or pytest-less shells' habit): the operators are words here.
    #[error("`{token}` is not an operator here: the operators are `and`, `or` and `not`")]
    CStyle { token: String },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Word(String),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

impl Expr {
    pub fn parse(text: &str) -> Result<Expr, ExprError> {
        let tokens = tokenize(text)?;
        if tokens.is_empty() {
            return Err(ExprError::Empty);
        }
        if let Some(t) = tokens.iter().find(|t| t.c_style()) {
            return Err(ExprError::CStyle { token: t.text.clone() });
        }
        // The parser, `eval` and the drop of the tree all recurse: bounded, so no input can
        // overflow the stack.
        if tokens.len() > MAX_TOKENS {
            return Err(ExprError::TooLong { tokens: tokens.len() });
        }
        let mut p = TagParser { tokens, pos: 0, depth: 0 };
        let e = p.or()?;
        if let Some(t) = p.tokens.get(p.pos) {
            return Err(ExprError::Trailing { token: t.text.clone(), text: text.to_string() });
        }
        Ok(e)
    }

    /// Every word, in order.
    fn words<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Expr::Word(w) => out.push(w),
            Expr::Not(e) => e.words(out),
            Expr::And(a, b) | Expr::Or(a, b) => {
                a.words(out);
                b.words(out);
            }
        }
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
fn with_hint(flag: Flag, text: &str, error: &ExprError) -> String {
    let short = flag.short();
    if let ExprError::CStyle { .. } = error {
        return format!("{short}: {error}\n  = help: write `{short} '{}'`", spelled_out(text));
    }
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

/// The expression with C's `&&`, `||` and `!` written as `and`, `or` and `not` (quoted
/// phrases kept as written).
fn spelled_out(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    let mut quote: Option<char> = None;
    // At the start of a word: where a `!` is a `not`.
    let mut word_start = true;
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            out.push(c);
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => {
                quote = Some(c);
                out.push(c);
            }
            '&' | '|' => {
                while chars.peek() == Some(&c) {
                    chars.next();
                }
                out.push_str(if c == '&' { " and " } else { " or " });
                word_start = true;
                continue;
            }
            '!' if word_start => {
                out.push_str("not ");
                continue;
            }
            c => out.push(c),
        }
        word_start = c.is_whitespace() || c == '(';
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ").replace("( ", "(").replace(" )", ")")
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

    /// `&&`, `||`, `!x`: an operator of C (or of a shell), unquoted.
    fn c_style(&self) -> bool {
        !self.quoted && (self.text.starts_with('!') || self.text.contains("&&") || self.text.contains("||"))
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

fn tokenize(text: &str) -> Result<Vec<Token>, ExprError> {
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
                    return Err(ExprError::UnclosedQuote { quote: c, text: text.to_string() });
                }
                if phrase.is_empty() {
                    return Err(ExprError::EmptyQuotes { text: text.to_string() });
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
    fn or(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.and()?;
        while self.peek() == Some("or") {
            self.pos += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }
    fn and(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.not()?;
        while self.peek() == Some("and") {
            self.pos += 1;
            left = Expr::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }
    fn deeper(&mut self) -> Result<(), ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ExprError::TooDeep);
        }
        Ok(())
    }
    fn not(&mut self) -> Result<Expr, ExprError> {
        if self.peek() == Some("not") {
            self.pos += 1;
            self.deeper()?;
            let e = Expr::Not(Box::new(self.not()?));
            self.depth -= 1;
            return Ok(e);
        }
        self.atom()
    }
    fn atom(&mut self) -> Result<Expr, ExprError> {
        match self.peek() {
            Some("(") => {
                self.pos += 1;
                self.deeper()?;
                let e = self.or()?;
                if self.peek() != Some(")") {
                    return Err(ExprError::MissingParen);
                }
                self.pos += 1;
                self.depth -= 1;
                Ok(e)
            }
            Some(")" | "and" | "or") => Err(ExprError::Unexpected { token: self.tokens[self.pos].text.clone() }),
            Some(_) => {
                let w = self.tokens[self.pos].text.clone();
                self.pos += 1;
                Ok(Expr::Word(w))
            }
            None => Err(ExprError::EndsEarly),
        }
    }
}

/// `--shard K/N` (1-based K).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

/// A `--shard` that is not `K/N` with `1 <= K <= N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("expected K/N, got `{0}`")]
    NotKOverN(String),
    #[error("bad shard index `{0}`")]
    BadIndex(String),
    #[error("bad shard count `{0}`")]
    BadCount(String),
    #[error("shard must satisfy 1 <= K <= N, got {index}/{count}")]
    OutOfRange { index: u64, count: u64 },
}

impl std::str::FromStr for Shard {
    type Err = ShardError;
    fn from_str(s: &str) -> Result<Self, ShardError> {
        let (k, n) = s.split_once('/').ok_or_else(|| ShardError::NotKOverN(s.to_string()))?;
        let index: u64 = k.trim().parse().map_err(|_| ShardError::BadIndex(k.to_string()))?;
        let count: u64 = n.trim().parse().map_err(|_| ShardError::BadCount(n.to_string()))?;
        if count == 0 || index == 0 || index > count {
            return Err(ShardError::OutOfRange { index, count });
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
        assert_eq!(Expr::parse("\"exit codes").unwrap_err().to_string(), "missing closing \" in `\"exit codes`");
        assert!(Expr::parse("''").unwrap_err().to_string().contains("empty quotes"));
    }

    /// Issue 26 item 15: `((((…` overflowed the stack.
    #[test]
    fn nesting_and_length_are_bounded() {
        let ok = format!("{}a{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        assert!(Expr::parse(&ok).is_ok());
        let deep = format!("{}a{}", "(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
        assert!(Expr::parse(&deep).unwrap_err().to_string().contains("nested too deep"));
        let nots = "not ".repeat(MAX_DEPTH + 1) + "a";
        assert!(Expr::parse(&nots).unwrap_err().to_string().contains("nested too deep"));
        // Depth is what is open at once, not how many there are.
        let many = vec!["(a)"; 200].join(" or ");
        assert!(Expr::parse(&many).is_ok());
        let long = vec!["a"; MAX_TOKENS].join(" and ");
        assert!(Expr::parse(&long).unwrap_err().to_string().contains("too long"));
    }

    /// Issue 28 item 4: a caller matches the failure by kind, and the text stays as it was.
    #[test]
    fn errors_have_kinds_and_keep_their_text() {
        assert_eq!(Expr::parse("  ").unwrap_err(), ExprError::Empty);
        assert_eq!(Expr::parse("(a").unwrap_err(), ExprError::MissingParen);
        assert_eq!(Expr::parse("a and").unwrap_err(), ExprError::EndsEarly);
        assert_eq!(Expr::parse("a and or b").unwrap_err(), ExprError::Unexpected { token: "or".into() });
        assert_eq!(Expr::parse("a b").unwrap_err(), ExprError::Trailing { token: "b".into(), text: "a b".into() });
        assert_eq!(Expr::parse("a b").unwrap_err().to_string(), "unexpected `b` in `a b`");
        assert_eq!(Expr::parse(&"not ".repeat(MAX_DEPTH + 1)).unwrap_err(), ExprError::TooDeep);
        assert_eq!(
            ExprError::TooLong { tokens: 1999 }.to_string(),
            "expression too long: 1999 words and parentheses, at most 1000"
        );

        let e = Selection::new(None, Some("a and"), None).unwrap_err();
        assert_eq!((e.flag, &e.error), (Flag::Tags, &ExprError::EndsEarly));
        assert_eq!(e.to_string(), "-t: expression ends too early");
        let e = Selection::new(Some("exit codes"), None, None).unwrap_err();
        assert_eq!(e.flag, Flag::Name);
        assert!(matches!(e.error, ExprError::Trailing { .. }));
        assert_eq!(
            e.to_string(),
            "-k: `exit codes` is two words with no `and` or `or` between them\n  = help: `-k 'exit and codes'` \
             selects names with both words; `-k '\"exit codes\"'` selects names with the phrase"
        );

        assert_eq!("3".parse::<Shard>().unwrap_err(), ShardError::NotKOverN("3".into()));
        assert_eq!("x/3".parse::<Shard>().unwrap_err(), ShardError::BadIndex("x".into()));
        assert_eq!("1/y".parse::<Shard>().unwrap_err(), ShardError::BadCount("y".into()));
        assert_eq!("4/3".parse::<Shard>().unwrap_err(), ShardError::OutOfRange { index: 4, count: 3 });
        assert_eq!("4/3".parse::<Shard>().unwrap_err().to_string(), "shard must satisfy 1 <= K <= N, got 4/3");
    }

    /// Issue 37 item 7: C's operators get the expression spelled with words.
    #[test]
    fn c_style_operators_get_the_words() {
        let e = Selection::new(None, Some("fast && !egress"), None).unwrap_err();
        assert_eq!(e.error, ExprError::CStyle { token: "&&".into() });
        assert_eq!(
            e.to_string(),
            "-t: `&&` is not an operator here: the operators are `and`, `or` and `not`\n  = help: write `-t 'fast and not egress'`"
        );
        assert_eq!(spelled_out("!a||(b&&!c)"), "not a or (b and not c)");
        assert_eq!(spelled_out("'x && y' && !(z)"), "'x && y' and not (z)");
        let e = Selection::new(Some("!slow"), None, None).unwrap_err();
        assert!(e.to_string().ends_with("write `-k 'not slow'`"), "{e}");
        // Quoted, they are words; inside a word, `!` is a letter.
        assert!(Expr::parse("'a && b' and wow!").is_ok());
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
