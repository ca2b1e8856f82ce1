//! Durations on the command line: `30s`, `500ms`, `2m`, `1h`, `1m30s`; a
//! bare number is seconds. Overflow is an error, not a wrap.

use std::time::Duration;

/// Parses a duration flag's value; the error is clap's message.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration (try 30s, 500ms, 2m)".into());
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let n: u64 = number
            .parse()
            .map_err(|_| format!("bad duration {text:?} (try 30s, 500ms, 2m)"))?;
        let part = match unit {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3600).map(Duration::from_secs),
            "d" => n.checked_mul(86_400).map(Duration::from_secs),
            _ => {
                return Err(format!(
                    "bad duration unit in {text:?} (use ms, s, m, h or d)"
                ))
            }
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or_else(|| format!("duration {text:?} is too long"))?;
        rest = next;
    }
    Ok(total)
}

/// `27.1s`, `850ms`, `2m5s`: how a duration is shown.
pub(crate) fn show(d: Duration) -> String {
    if d == Duration::MAX {
        return "no expiry".into();
    }
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// Milliseconds, for JSON.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("12"), Ok(Duration::from_secs(12)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_garbage_and_overflow() {
        for bad in [
            "",
            "soon",
            "5x",
            "s",
            "-1s",
            "1.5s",
            "99999999999999999999s",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("18446744073709551615h").is_err());
    }

    #[test]
    fn shows() {
        assert_eq!(show(Duration::from_millis(850)), "850ms");
        assert_eq!(show(Duration::from_millis(27_140)), "27.1s");
        assert_eq!(show(Duration::from_secs(125)), "2m5s");
        assert_eq!(show(Duration::from_secs(7300)), "2h1m");
        assert_eq!(show(Duration::MAX), "no expiry");
    }
}
