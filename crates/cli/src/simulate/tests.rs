//! Unit tests of `gradwire simulate`'s parameter counts.

use super::args::param_count;
use super::model_parallel::format_params;

#[test]
fn parameter_counts() {
    assert_eq!(param_count("100M"), Ok(1e8));
    assert_eq!(param_count("1.7B"), Ok(1.7e9));
    assert_eq!(param_count("1.7g"), Ok(1.7e9));
    assert_eq!(param_count("2e9"), Ok(2e9));
    assert_eq!(param_count("42k"), Ok(42e3));
    assert_eq!(param_count("12"), Ok(12.0));
    for bad in ["", "M", "1.7X", "-5M", "0", "inf", "1e"] {
        assert!(param_count(bad).is_err(), "{bad}");
    }
    assert_eq!(format_params(1_700_000_000), "1.70B");
    assert_eq!(format_params(100_020_000), "100M");
}
