//! Durations as authors write them: `500ms`, `30s`, `2m`, `1h`, `1m30s`; a bare number is seconds.

use std::time::Duration;

pub fn parse(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<f64>() {
        return if secs >= 0.0 && secs.is_finite() {
            Ok(Duration::from_secs_f64(secs))
        } else {
            Err(format!("invalid duration `{t}`"))
        };
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_end == 0 {
            return Err(format!("invalid duration `{t}`"));
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| format!("invalid duration `{t}`"))?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let factor = match &rest[..unit_end] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("invalid duration `{t}`: a unit is missing after {n}")),
            u => return Err(format!("invalid duration `{t}`: unknown unit `{u}`")),
        };
        total += Duration::from_secs_f64(n * factor);
        rest = &rest[unit_end..];
    }
    Ok(total)
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

pub const HINT: &str = "write a number with a unit: `500ms`, `30s`, `2m`, `1h`, `1m30s`";

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
        assert!(parse("10 seconds").unwrap_err().contains("unknown unit"));
        assert!(parse("abc").is_err());
        assert!(parse("").is_err());
        assert!(parse("-1").is_err());
    }
}
