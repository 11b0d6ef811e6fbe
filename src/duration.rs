//! Durations as authors write them: `500ms`, `30s`, `2m`, `1h`, `1m30s`; a bare number is seconds.
//!
//! Every conversion is checked and bounded by [`MAX`]: a duration comes from a scenario file,
//! a flag or a template, and `Duration::from_secs_f64` panics on what does not fit, while a
//! deadline of `now + u64::MAX s` panics when it is added to an `Instant`. A year is far longer
//! than any end-to-end test, so anything longer is a typo and gets an error, not a panic.

use std::time::Duration;

/// The longest duration accepted anywhere: 366 days.
pub const MAX: Duration = Duration::from_secs(366 * 24 * 3600);

/// Why a duration is refused. Each variant keeps the text as written, for the message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseDurationError {
    #[error("empty duration")]
    Empty,
    /// Not a number, or a number with no unit of its own: `abc`, `-1`, `1.2.3s`.
    #[error("invalid duration `{0}`")]
    Invalid(String),
    /// A number of seconds that is negative, infinite or not a number.
    #[error("invalid duration `{0}`: it must be a number of seconds, 0 or more")]
    NotSeconds(String),
    /// `30` followed by nothing where a unit belongs (`1m30`).
    #[error("invalid duration `{text}`: a unit is missing after {number}")]
    MissingUnit { text: String, number: f64 },
    #[error("invalid duration `{text}`: unknown unit `{unit}`")]
    UnknownUnit { text: String, unit: String },
    /// Longer than [`MAX`].
    #[error("duration `{0}` is too long: the longest is 366 days (8784h)")]
    TooLong(String),
}

/// A number of seconds as a duration, if it is finite, not negative, and at most [`MAX`].
pub fn from_secs_f64(secs: f64) -> Result<Duration, ParseDurationError> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(ParseDurationError::NotSeconds(format!("{secs}")));
    }
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX => Ok(d),
        _ if secs < 1e15 => Err(too_long(&format!("{secs}"))),
        _ => Err(too_long(&format!("{secs:e}"))),
    }
}

fn too_long(text: &str) -> ParseDurationError {
    ParseDurationError::TooLong(text.to_string())
}

pub fn parse(text: &str) -> Result<Duration, ParseDurationError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ParseDurationError::Empty);
    }
    let invalid = || ParseDurationError::Invalid(t.to_string());
    if let Ok(secs) = t.parse::<f64>() {
        return if secs >= 0.0 && secs.is_finite() {
            from_secs_f64(secs).map_err(|_| too_long(t))
        } else {
            Err(invalid())
        };
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_end == 0 {
            return Err(invalid());
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| invalid())?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let factor = match &rest[..unit_end] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(ParseDurationError::MissingUnit { text: t.to_string(), number: n }),
            u => return Err(ParseDurationError::UnknownUnit { text: t.to_string(), unit: u.to_string() }),
        };
        let part = from_secs_f64(n * factor).map_err(|_| too_long(t))?;
        total = total.checked_add(part).filter(|d| *d <= MAX).ok_or_else(|| too_long(t))?;
        rest = &rest[unit_end..];
    }
    Ok(total)
}

/// `d * factor`, saturating at [`MAX`] instead of panicking (retry backoff).
pub fn saturating_mul_f64(d: Duration, factor: f64) -> Duration {
    from_secs_f64(d.as_secs_f64() * factor).unwrap_or(MAX)
}

/// Short human form: `0.42s`, `12.3s`, `1m03s`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.2}s")
    } else {
        let m = (s / 60.0).floor() as u64;
        format!("{m}m{:02}s", (s - m as f64 * 60.0).round() as u64)
    }
}

pub const HINT: &str = "write a number with a unit: `500ms`, `30s`, `2m`, `1h`, `1m30s`; a bare number is seconds";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_compounds() {
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("300").unwrap(), Duration::from_secs(300));
    }

    #[test]
    fn rejects_nonsense() {
        assert!(parse("10 seconds").unwrap_err().to_string().contains("unknown unit"));
        assert!(parse("abc").is_err());
        assert!(parse("").is_err());
        assert!(parse("-1").is_err());
    }

    #[test]
    fn huge_durations_are_errors_not_panics() {
        for t in ["99999999999999999999h", "1e300", "1e20", "9999999h", "367d", "8785h", "200000000000000000000ms"] {
            let e = parse(t);
            assert!(e.is_err(), "{t}: {e:?}");
        }
        assert!(parse("99999999999999999999h").unwrap_err().to_string().contains("too long"));
        assert_eq!(parse("8784h").unwrap(), MAX);
        assert!(from_secs_f64(f64::NAN).is_err());
        assert!(from_secs_f64(1e300).is_err());
        assert_eq!(saturating_mul_f64(Duration::from_millis(1), 1e300), MAX);
        assert_eq!(saturating_mul_f64(Duration::from_secs(2), 1.5), Duration::from_secs(3));
    }

    /// Issue 28 item 4: each refusal is a kind a caller can match, with the text it had.
    #[test]
    fn errors_have_kinds_and_keep_their_text() {
        use ParseDurationError as E;
        assert_eq!(parse(" "), Err(E::Empty));
        assert_eq!(parse("-1"), Err(E::Invalid("-1".into())));
        assert_eq!(parse("abc"), Err(E::Invalid("abc".into())));
        assert_eq!(parse("1m30"), Err(E::MissingUnit { text: "1m30".into(), number: 30.0 }));
        assert_eq!(parse("1m30").unwrap_err().to_string(), "invalid duration `1m30`: a unit is missing after 30");
        assert_eq!(parse("10 seconds"), Err(E::UnknownUnit { text: "10 seconds".into(), unit: " seconds".into() }));
        assert_eq!(
            parse("10 seconds").unwrap_err().to_string(),
            "invalid duration `10 seconds`: unknown unit ` seconds`"
        );
        assert_eq!(parse("8785h"), Err(E::TooLong("8785h".into())));
        assert_eq!(
            parse("8785h").unwrap_err().to_string(),
            "duration `8785h` is too long: the longest is 366 days (8784h)"
        );
        assert_eq!(from_secs_f64(-1.0), Err(E::NotSeconds("-1".into())));
        assert_eq!(
            from_secs_f64(f64::NAN).unwrap_err().to_string(),
            "invalid duration `NaN`: it must be a number of seconds, 0 or more"
        );
        assert_eq!(from_secs_f64(1e300), Err(E::TooLong("1e300".into())));
    }
}
