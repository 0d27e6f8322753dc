//! Byte sizes as written on a command line: `4KiB`, `1MiB`, `16M`, `512`.

/// A byte size that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No number in front.
    #[error("'{0}' is not a size (e.g. 4KiB, 16MiB)")]
    NotASize(String),
    /// A suffix that is not a unit.
    #[error("unknown unit '{unit}' in '{text}' (use KiB, MiB, GiB)")]
    UnknownUnit {
        /// The suffix, lowercased.
        unit: String,
        /// The whole text.
        text: String,
    },
    /// More bytes than a `usize` holds.
    #[error("'{0}' is too large")]
    TooLarge(String),
}

/// Parses a byte size with an optional binary (`KiB`, `MiB`, `GiB`, or `K`, `M`, `G`) or
/// decimal (`KB`, `MB`, `GB`) suffix.
pub fn parse_size(s: &str) -> Result<usize, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| SizeError::NotASize(s.into()))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        u => {
            return Err(SizeError::UnknownUnit {
                unit: u.into(),
                text: s.into(),
            })
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| SizeError::TooLarge(s.into()))
}

/// Formats a byte count the way the sizes are usually written (`4KiB`, `64MiB`, `1000B`).
pub fn format_size(bytes: usize) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size(" 2GiB "), Ok(2 << 30));
        assert_eq!(parse_size("10kb"), Ok(10_000));
        assert_eq!(parse_size("3MB"), Ok(3_000_000));
        assert_eq!(parse_size("12"), Ok(12));
        assert_eq!(parse_size("12b"), Ok(12));
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        assert_eq!(parse_size("x"), Err(SizeError::NotASize("x".into())));
        assert_eq!(
            parse_size("4XB").unwrap_err().to_string(),
            "unknown unit 'xb' in '4XB' (use KiB, MiB, GiB)"
        );
        assert!(matches!(
            parse_size("99999999999999999999GiB"),
            Err(SizeError::NotASize(_))
        ));
        assert!(matches!(
            parse_size(&format!("{}GiB", usize::MAX >> 20)),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn formats_whole_units_and_round_trips() {
        assert_eq!(format_size(64 << 20), "64MiB");
        assert_eq!(format_size(4096), "4KiB");
        assert_eq!(format_size(3 << 30), "3GiB");
        assert_eq!(format_size(1000), "1000B");
        assert_eq!(format_size(1536), "1536B");
        for b in [1, 4, 1000, 4096, 1536, 64 << 20, 5 << 30] {
            assert_eq!(parse_size(&format_size(b)), Ok(b));
        }
    }
}
