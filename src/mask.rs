//! Secret masking: replaces secret values, and the encoded forms they commonly take in
//! command output and HTTP traffic, with `***` before anything reaches a report.
//!
//! For every secret the [`Masker`] matches, in one Aho-Corasick pass (leftmost-longest):
//!
//! - the value itself (and its whitespace-trimmed form, for values read from files);
//! - base64: standard and URL-safe alphabets, with and without padding;
//! - percent-encoding: `%20` and `+` for spaces, upper- and lower-case hex digits;
//! - JSON string escaping, as `serde_json::to_string` writes it without the quotes, and that
//!   escaping applied twice (JSON inside a JSON string);
//! - hex of the bytes, lower and upper case.
//!
//! base64 of a secret inside a longer base64 string (HTTP basic auth is
//! `base64("user:" + secret)`, a JWT payload is base64 of JSON) does not contain base64 of
//! the secret as a substring, because base64 works in 3-byte groups. A second pass therefore
//! finds base64-looking tokens (runs of at least 8 base64 characters), decodes them (both
//! alphabets, at each of the four alignments) and masks the whole token when the decoded
//! bytes contain any form of a secret.
//!
//! Values shorter than [`MIN_SECRET_LEN`] characters are ignored: masking every `abc` or
//! `1` in a log would destroy it while protecting nothing, since such values are guessable
//! anyway. Not covered: a base64 encoding broken across lines (MIME wrapping), and secrets
//! split across separately masked texts.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::alphabet;
use base64::engine::general_purpose::{
    GeneralPurpose, GeneralPurposeConfig, STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use regex::Regex;

/// What a masked secret is replaced with.
pub const MASK: &str = "***";

/// Shorter values are not treated as secrets (see the module docs).
pub const MIN_SECRET_LEN: usize = 4;

/// Environment variable names containing one of these (case-insensitive) hold secrets.
pub const SECRET_NAME_PARTS: [&str; 4] = ["KEY", "SECRET", "TOKEN", "PASSWORD"];

/// Masks a fixed set of secret values. Cheap to clone; `Debug` never shows the values.
#[derive(Clone)]
pub struct Masker {
    secrets: usize,
    /// Every form of every secret; `None` when there are no secrets.
    forms: Option<AhoCorasick>,
    base64_token: Regex,
}

impl fmt::Debug for Masker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masker").field("secrets", &self.secrets).finish_non_exhaustive()
    }
}

impl Default for Masker {
    fn default() -> Self {
        Self::new(std::iter::empty())
    }
}

const LENIENT: GeneralPurposeConfig = GeneralPurposeConfig::new()
    .with_decode_padding_mode(DecodePaddingMode::RequireNone)
    .with_decode_allow_trailing_bits(true);
const LENIENT_STANDARD: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
const LENIENT_URL_SAFE: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

impl Masker {
    /// A masker for these values. Values shorter than [`MIN_SECRET_LEN`] characters, leading and
    /// trailing whitespace not counted, are ignored; a value with such whitespace is masked both
    /// as given and trimmed.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = Vec::new();
        for s in secrets {
            let trimmed = s.trim();
            if trimmed.chars().count() < MIN_SECRET_LEN {
                continue;
            }
            if trimmed != s {
                values.push(trimmed.to_string());
            }
            values.push(s);
        }
        values.sort();
        values.dedup();

        let mut forms: Vec<String> = Vec::new();
        for s in &values {
            forms.extend(derived_forms(s));
        }
        forms.retain(|f| f.len() >= MIN_SECRET_LEN);
        forms.sort();
        forms.dedup();

        let automaton = (!forms.is_empty()).then(|| {
            AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&forms).expect("secret patterns build")
        });
        Masker {
            secrets: values.len(),
            forms: automaton,
            base64_token: Regex::new(r"[A-Za-z0-9+/_-]{8,}={0,2}").expect("static regex"),
        }
    }

    /// Every variable whose name contains KEY, SECRET, TOKEN or PASSWORD (any case), and
    /// every variable named in `extra_names`, is a secret.
    pub fn from_env(env: &BTreeMap<String, String>, extra_names: &[String]) -> Self {
        Self::new(
            env.iter()
                .filter(|(name, _)| {
                    let upper = name.to_ascii_uppercase();
                    SECRET_NAME_PARTS.iter().any(|p| upper.contains(p)) || extra_names.contains(name)
                })
                .map(|(_, value)| value.clone()),
        )
    }

    /// Number of distinct secret values being masked.
    pub fn len(&self) -> usize {
        self.secrets
    }

    pub fn is_empty(&self) -> bool {
        self.secrets == 0
    }

    /// `text` with every secret, and every derived form, replaced by [`MASK`]. Borrowed when
    /// nothing needed masking.
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(ac) = &self.forms else { return Cow::Borrowed(text) };
        // Whole base64 tokens first, so a token with a secret inside is masked entirely rather
        // than around a directly matched, aligned base64 fragment.
        let mut out = match self.mask_base64_tokens(ac, text) {
            Some(masked) => Cow::Owned(masked),
            None => Cow::Borrowed(text),
        };
        if ac.is_match(out.as_ref()) {
            let mut dst = String::with_capacity(out.len());
            ac.replace_all_with(&out, &mut dst, |_, _, dst| {
                dst.push_str(MASK);
                true
            });
            out = Cow::Owned(dst);
        }
        out
    }

    /// Mask every string in `v`, object keys included.
    pub fn mask_json(&self, v: &mut serde_json::Value) {
        use serde_json::Value;
        if self.is_empty() {
            return;
        }
        match v {
            Value::String(s) => {
                if let Cow::Owned(m) = self.mask(s) {
                    *s = m;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.mask_json(item)),
            Value::Object(map) => {
                let old = std::mem::take(map);
                for (key, mut value) in old {
                    self.mask_json(&mut value);
                    map.insert(self.mask(&key).into_owned(), value);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// The second pass: whole base64 tokens whose decoding contains a secret.
    fn mask_base64_tokens(&self, ac: &AhoCorasick, text: &str) -> Option<String> {
        let mut out: Option<String> = None;
        let mut last = 0;
        for m in self.base64_token.find_iter(text) {
            if decodes_to_secret(ac, m.as_str()) {
                let dst = out.get_or_insert_with(|| String::with_capacity(text.len()));
                dst.push_str(&text[last..m.start()]);
                dst.push_str(MASK);
                last = m.end();
            }
        }
        let mut dst = out?;
        dst.push_str(&text[last..]);
        Some(dst)
    }
}

fn decodes_to_secret(ac: &AhoCorasick, token: &str) -> bool {
    let body = token.trim_end_matches('=').as_bytes();
    for skip in 0..4 {
        let Some(rest) = body.get(skip..) else { break };
        // A single character left over at the end encodes no whole byte.
        let rest = if rest.len() % 4 == 1 { &rest[..rest.len() - 1] } else { rest };
        if rest.len() < 4 {
            break;
        }
        for engine in [&LENIENT_STANDARD, &LENIENT_URL_SAFE] {
            if let Ok(bytes) = engine.decode(rest) {
                if ac.is_match(bytes.as_slice()) {
                    return true;
                }
            }
        }
    }
    false
}

/// The forms one secret can take; see the module docs.
fn derived_forms(s: &str) -> Vec<String> {
    let mut forms = vec![s.to_string()];
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        forms.push(engine.encode(s));
    }
    let percent = urlencoding::encode(s).into_owned();
    let plus = percent.replace("%20", "+");
    for p in [percent, plus] {
        forms.push(lowercase_percent_hex(&p));
        forms.push(p);
    }
    let json = serde_json::to_string(s).expect("strings serialise");
    let json = json[1..json.len() - 1].to_string();
    let json2 = serde_json::to_string(&json).expect("strings serialise");
    forms.push(json2[1..json2.len() - 1].to_string());
    forms.push(json);
    let hex: String = s.bytes().map(|b| format!("{b:02x}")).collect();
    forms.push(hex.to_ascii_uppercase());
    forms.push(hex);
    forms
}

/// `%2F` → `%2f`, leaving everything else alone.
fn lowercase_percent_hex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut after_percent = 0;
    for c in s.chars() {
        if after_percent > 0 {
            out.push(c.to_ascii_lowercase());
            after_percent -= 1;
        } else {
            if c == '%' {
                after_percent = 2;
            }
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SECRET: &str = "s3cr3t p@ss/wörd~+\"x\"\\";

    fn masker() -> Masker {
        Masker::new([SECRET.to_string(), "tok_ABCDEF123456".to_string()])
    }

    fn assert_masked(m: &Masker, text: &str) -> String {
        let out = m.mask(text).into_owned();
        assert!(out.contains(MASK), "not masked: {text:?} -> {out:?}");
        out
    }

    #[test]
    fn raw_value_every_occurrence() {
        let m = masker();
        let text = format!("a {SECRET} b {SECRET}c tok_ABCDEF123456");
        assert_eq!(m.mask(&text), "a *** b ***c ***");
    }

    #[test]
    fn longest_secret_wins_when_one_contains_another() {
        let m = Masker::new(["abcd".to_string(), "abcdefgh".to_string()]);
        assert_eq!(m.mask("x abcdefgh y abcd"), "x *** y ***");
    }

    #[test]
    fn base64_all_four_forms() {
        let m = masker();
        for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
            let enc = engine.encode(SECRET);
            let out = assert_masked(&m, &format!("value: {enc} end"));
            assert_eq!(out, "value: *** end", "{enc}");
        }
        // The standard and URL-safe encodings of this secret really differ.
        assert_ne!(STANDARD.encode(SECRET), URL_SAFE.encode(SECRET));
    }

    #[test]
    fn base64_embedded_in_a_longer_token_basic_auth() {
        let m = masker();
        for user in ["u", "us", "user", "admin:"] {
            let token = STANDARD.encode(format!("{user}:{SECRET}"));
            let header = format!("Authorization: Basic {token}\r\nHost: x");
            assert_eq!(m.mask(&header), "Authorization: Basic ***\r\nHost: x", "{user}");
        }
    }

    #[test]
    fn base64_in_jwt_payload() {
        let m = masker();
        let payload = URL_SAFE_NO_PAD.encode(json!({"sub": "me", "key": "tok_ABCDEF123456"}).to_string());
        let jwt = format!("eyJhbGciOiJIUzI1NiJ9.{payload}.c2lnbmF0dXJl");
        assert_eq!(m.mask(&jwt), "eyJhbGciOiJIUzI1NiJ9.***.c2lnbmF0dXJl");
    }

    #[test]
    fn url_encoded_forms() {
        let m = masker();
        let pct = urlencoding::encode(SECRET).into_owned();
        assert!(pct.contains("%20") && pct.contains("%2F"), "{pct}");
        assert_eq!(m.mask(&format!("GET /?p={pct}&x=1")), "GET /?p=***&x=1");
        let plus = pct.replace("%20", "+");
        assert_eq!(m.mask(&format!("p={plus}&x=1")), "p=***&x=1");
        let lower = lowercase_percent_hex(&pct);
        assert_ne!(lower, pct);
        assert_eq!(m.mask(&format!("p={lower}")), "p=***");
    }

    #[test]
    fn json_escaped_forms() {
        let m = masker();
        let body = json!({"password": SECRET}).to_string();
        assert!(!body.contains(SECRET), "escaping changes the value: {body}");
        assert_eq!(m.mask(&body), r#"{"password":"***"}"#);
        let nested = json!({"body": body}).to_string();
        assert_eq!(m.mask(&nested), r#"{"body":"{\"password\":\"***\"}"}"#);
    }

    #[test]
    fn hex_forms() {
        let m = masker();
        let hex: String = "tok_ABCDEF123456".bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(m.mask(&format!("0x{hex}")), "0x***");
        assert_eq!(m.mask(&hex.to_uppercase()), "***");
    }

    #[test]
    fn other_text_is_untouched_and_borrowed() {
        let m = masker();
        let text = "configuration Authorization: Basic dXNlcjpvdGhlcg== s3cr3t p@ss \u{1b}[31m {}";
        assert!(matches!(m.mask(text), Cow::Borrowed(t) if t == text));
        assert!(matches!(Masker::default().mask(SECRET), Cow::Borrowed(_)));
    }

    #[test]
    fn short_values_are_ignored() {
        let m = Masker::new(["abc".to_string(), "1".to_string(), String::new(), "   ab  ".to_string()]);
        assert!(m.is_empty());
        assert_eq!(m.mask("abc 1 ab"), "abc 1 ab");
        // Multibyte: four characters count even if the bytes are more.
        let m = Masker::new(["äöüß".to_string()]);
        assert_eq!(m.len(), 1);
        assert_eq!(m.mask("x äöüß"), "x ***");
    }

    #[test]
    fn trimmed_value_also_masked() {
        let m = Masker::new(["hunter22\n".to_string()]);
        assert_eq!(m.mask("pw=hunter22;"), "pw=***;");
    }

    #[test]
    fn from_env_picks_secret_names() {
        let env: BTreeMap<String, String> = [
            ("E2B_API_KEY", "e2b_0123456789"),
            ("github_token", "ghp_abcdefghij"),
            ("DB_PASSWORD", "correct horse"),
            ("MySecret", "shhh-quiet"),
            ("DEPLOY_URL", "https://internal.example"),
            ("HOME", "/home/user"),
            ("SHORT_TOKEN", "abc"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let m = Masker::from_env(&env, &["DEPLOY_URL".to_string()]);
        assert_eq!(m.len(), 5);
        let text = "e2b_0123456789 ghp_abcdefghij correct horse shhh-quiet https://internal.example /home/user abc";
        assert_eq!(m.mask(text), "*** *** *** *** *** /home/user abc");
    }

    #[test]
    fn mask_json_values_and_keys() {
        let m = masker();
        let mut v = json!({
            "stdout": format!("token {SECRET}\n"),
            "tok_ABCDEF123456": [1, "x", {"deep": ["tok_ABCDEF123456"]}],
            "n": 3,
        });
        m.mask_json(&mut v);
        assert_eq!(v, json!({"stdout": "token ***\n", "***": [1, "x", {"deep": ["***"]}], "n": 3}));
        // Key order is kept.
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["stdout", "***", "n"]);
    }

    #[test]
    fn debug_does_not_leak() {
        let text = format!("{:?}", masker());
        assert_eq!(text, "Masker { secrets: 2, .. }");
    }

    #[test]
    fn megabytes_of_output() {
        let m = masker();
        let line = "lorem ipsum dolor sit amet configuration 0123456789abcdef QmFzZTY0IG5vaXNl\n";
        let mut text = line.repeat(40_000); // ~3 MB
        text.push_str(&format!("Basic {}\n", STANDARD.encode(format!("u:{SECRET}"))));
        text.push_str("tok_ABCDEF123456\n");
        let start = std::time::Instant::now();
        let out = m.mask(&text);
        let elapsed = start.elapsed();
        assert!(out.ends_with("Basic ***\n***\n"));
        let noise = line.len() * 40_000;
        assert_eq!(out[..noise], text[..noise]);
        // Generous, so debug builds on slow machines pass; a quadratic algorithm would not.
        assert!(elapsed.as_secs() < 20, "{elapsed:?}");
    }
}
