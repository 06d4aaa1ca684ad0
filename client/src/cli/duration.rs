//! Durations as people type them: `500ms`, `30s`, `2m`, `1h`, `1m30s`,
//! `1.5s`. A bare number means seconds.

use std::time::Duration;

/// Parses a duration for clap; the error says what is accepted.
pub fn parse(text: &str) -> Result<Duration, String> {
    parse_inner(text.trim()).ok_or_else(|| {
        format!(
            "invalid duration {text:?}: expected a number with a unit (ms, s, m, h), \
             like 500ms, 30s, 2m or 1m30s"
        )
    })
}

fn parse_inner(text: &str) -> Option<Duration> {
    if text.is_empty() {
        return None;
    }
    if let Ok(secs) = text.parse::<f64>() {
        return seconds(secs, 1.0);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let value: f64 = number.parse().ok()?;
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total = total.checked_add(seconds(value, scale)?)?;
        rest = after;
    }
    Some(total)
}

fn seconds(value: f64, scale: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(value * scale).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn common_forms_parse() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("200ms"), Ok(Duration::from_millis(200)));
    }

    #[test]
    fn nonsense_is_refused_with_a_hint() {
        for bad in ["", "ms", "5x", "-3s", "1.2.3s", "s5", "5 s"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("500ms"), "{bad}: {err}");
        }
    }
}
