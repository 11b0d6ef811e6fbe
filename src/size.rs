//! Byte sizes as users write them: `1000`, `512k`, `64MiB`, `1GB` (`k`/`m`/`g` and the
//! `KiB` forms count in 1024s, as docker's `--memory` does; `KB`/`MB`/`GB` in 1000s).

/// Why a size is refused; each variant keeps the text as written, for the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseSizeError {
    /// No number before the unit, or one too long for 64 bits.
    #[error("invalid size `{0}`: use a number of bytes, or e.g. 64MiB")]
    NotANumber(String),
    #[error("invalid size `{text}`: unknown unit `{unit}` (use KiB, MiB, GiB, KB, MB, GB)")]
    UnknownUnit { text: String, unit: String },
    /// More bytes than this machine's `usize`.
    #[error("size `{0}` is too large")]
    TooLarge(String),
}

pub fn parse(text: &str) -> Result<usize, ParseSizeError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| ParseSizeError::NotANumber(t.to_string()))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => return Err(ParseSizeError::UnknownUnit { text: t.to_string(), unit: other.to_string() }),
    };
    n.checked_mul(factor).and_then(|b| usize::try_from(b).ok()).ok_or_else(|| ParseSizeError::TooLarge(t.to_string()))
}

/// `64 MiB`, `1.5 GiB`, `300 B`: for messages.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    let text = format!("{v:.1}");
    format!("{} {}", text.trim_end_matches(".0"), UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse("1000"), Ok(1000));
        assert_eq!(parse("64MiB"), Ok(64 << 20));
        assert_eq!(parse("64m"), Ok(64 << 20));
        assert_eq!(parse("2 KB"), Ok(2000));
        assert_eq!(parse("1GiB"), Ok(1 << 30));
        assert!(parse("12 parsecs").unwrap_err().to_string().contains("unknown unit `parsecs`"));
        assert!(parse("MiB").is_err());
        assert!(parse("99999999999999999999").is_err());
    }

    /// Issue 28 item 4: each refusal is a kind a caller can match, with the text it had.
    #[test]
    fn errors_have_kinds_and_keep_their_text() {
        assert_eq!(parse(" MiB"), Err(ParseSizeError::NotANumber("MiB".into())));
        assert_eq!(parse("MiB").unwrap_err().to_string(), "invalid size `MiB`: use a number of bytes, or e.g. 64MiB");
        assert_eq!(parse("12 PB"), Err(ParseSizeError::UnknownUnit { text: "12 PB".into(), unit: "pb".into() }));
        assert_eq!(
            parse("12 PB").unwrap_err().to_string(),
            "invalid size `12 PB`: unknown unit `pb` (use KiB, MiB, GiB, KB, MB, GB)"
        );
        assert_eq!(parse("99999999999GiB"), Err(ParseSizeError::TooLarge("99999999999GiB".into())));
        assert_eq!(parse("99999999999GiB").unwrap_err().to_string(), "size `99999999999GiB` is too large");
        assert_eq!(parse("99999999999999999999"), Err(ParseSizeError::NotANumber("99999999999999999999".into())));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(300), "300 B");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
