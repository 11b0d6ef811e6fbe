//! Byte sizes as users write them: `1000`, `512k`, `64MiB`, `1GB` (`k`/`m`/`g` and the
//! `KiB` forms count in 1024s, as docker's `--memory` does; `KB`/`MB`/`GB` in 1000s).

pub fn parse(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size `{t}`: use a number of bytes, or e.g. 64MiB"))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => return Err(format!("invalid size `{t}`: unknown unit `{other}` (use KiB, MiB, GiB, KB, MB, GB)")),
    };
    n.checked_mul(factor).and_then(|b| usize::try_from(b).ok()).ok_or_else(|| format!("size `{t}` is too large"))
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
        assert!(parse("12 parsecs").unwrap_err().contains("unknown unit `parsecs`"));
        assert!(parse("MiB").is_err());
        assert!(parse("99999999999999999999").is_err());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(300), "300 B");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
