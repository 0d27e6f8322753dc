//! Byte sizes on the command line: `4KiB`, `1MiB`, `16M`, `512`.

/// Parses a byte size with an optional binary (`KiB`, `MiB`, `GiB`, or `K`, `M`, `G`) or
/// decimal (`KB`, `MB`, `GB`) suffix.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 4KiB, 16MiB)"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        u => return Err(format!("unknown unit '{u}' in '{s}' (use KiB, MiB, GiB)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// Formats a byte count the way the sizes are usually written (`4KiB`, `64MiB`).
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
    fn sizes() {
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("10kb"), Ok(10_000));
        assert_eq!(parse_size("12"), Ok(12));
        assert!(parse_size("x").is_err());
        assert!(parse_size("4XB").is_err());
        assert_eq!(format_size(64 << 20), "64MiB");
        assert_eq!(format_size(1000), "1000B");
    }
}
