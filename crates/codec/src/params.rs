//! Parsing the `key=value,...` part of a codec spec, with typed getters and clear errors.

use std::collections::BTreeMap;

/// Why a codec spec string was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// No codec of that name.
    #[error("unknown codec '{name}' (known: {known})")]
    UnknownCodec {
        /// The name given.
        name: String,
        /// The names this build knows.
        known: String,
    },
    /// A parameter the codec does not take.
    #[error("codec '{codec}' has no parameter '{param}' (it takes: {allowed})")]
    UnknownParam {
        /// The codec.
        codec: String,
        /// The parameter given.
        param: String,
        /// The parameters it takes.
        allowed: String,
    },
    /// A required parameter is absent.
    #[error("codec '{codec}' needs parameter '{param}'")]
    MissingParam {
        /// The codec.
        codec: String,
        /// The missing parameter.
        param: String,
    },
    /// A value that does not parse or is out of range.
    #[error("codec '{codec}': {param}={value} is invalid: {reason}")]
    BadValue {
        /// The codec.
        codec: String,
        /// The parameter.
        param: String,
        /// The value given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Not of the form `name` or `name:key=value,...`.
    #[error("malformed codec spec '{spec}': {reason}")]
    Malformed {
        /// The spec given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
}

/// The parameters of one codec spec, consumed by typed getters; [`Params::finish`] then
/// refuses any parameter nobody asked for.
#[derive(Debug, Clone)]
pub struct Params {
    codec: String,
    values: BTreeMap<String, String>,
    allowed: Vec<&'static str>,
}

impl Params {
    /// Splits `spec` (`name` or `name:key=value,key=value`) into its codec name and parameters.
    pub fn parse(spec: &str) -> Result<Params, ConfigError> {
        let malformed = |reason: &str| ConfigError::Malformed {
            spec: spec.to_string(),
            reason: reason.into(),
        };
        let spec_t = spec.trim();
        let (name, rest) = match spec_t.split_once(':') {
            Some((n, r)) => (n.trim(), Some(r)),
            None => (spec_t, None),
        };
        if name.is_empty() {
            return Err(malformed("empty codec name"));
        }
        let mut values = BTreeMap::new();
        if let Some(rest) = rest {
            for kv in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| malformed("expected key=value"))?;
                let (k, v) = (k.trim(), v.trim());
                if k.is_empty() || v.is_empty() {
                    return Err(malformed("empty key or value"));
                }
                if values.insert(k.to_string(), v.to_string()).is_some() {
                    return Err(malformed("parameter given twice"));
                }
            }
        }
        Ok(Params {
            codec: name.to_ascii_lowercase(),
            values,
            allowed: Vec::new(),
        })
    }

    /// The codec name (lower case).
    pub fn codec(&self) -> &str {
        &self.codec
    }

    fn raw(&mut self, key: &'static str) -> Option<String> {
        self.allowed.push(key);
        self.values.remove(key)
    }

    fn bad(&self, key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::BadValue {
            codec: self.codec.clone(),
            param: key.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    /// An f64 parameter within `[lo, hi]`, or `default` when absent (`None`: required).
    pub fn f64_in(
        &mut self,
        key: &'static str,
        default: Option<f64>,
        lo: f64,
        hi: f64,
    ) -> Result<f64, ConfigError> {
        self.number_in(key, default, (lo, hi), "not a number")
    }

    /// An unsigned integer parameter within `[lo, hi]`, or `default` when absent.
    pub fn usize_in(
        &mut self,
        key: &'static str,
        default: Option<usize>,
        lo: usize,
        hi: usize,
    ) -> Result<usize, ConfigError> {
        self.number_in(key, default, (lo, hi), "not a non-negative integer")
    }

    /// A number parameter within `[lo, hi]`, or `default` when absent (`None`: required);
    /// `unparsed` is the reason given for a value that does not parse as an `N`.
    fn number_in<N: Copy + std::str::FromStr + PartialOrd + std::fmt::Display>(
        &mut self,
        key: &'static str,
        default: Option<N>,
        (lo, hi): (N, N),
        unparsed: &str,
    ) -> Result<N, ConfigError> {
        match self.raw(key) {
            None => default.ok_or_else(|| ConfigError::MissingParam {
                codec: self.codec.clone(),
                param: key.into(),
            }),
            Some(v) => {
                let x: N = v.parse().map_err(|_| self.bad(key, &v, unparsed))?;
                if !(lo..=hi).contains(&x) {
                    return Err(self.bad(key, &v, format!("must be in [{lo}, {hi}]")));
                }
                Ok(x)
            }
        }
    }

    /// A boolean parameter (`true/false/1/0/yes/no/on/off`), or `default` when absent.
    pub fn bool(&mut self, key: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Ok(true),
                "false" | "0" | "no" | "off" => Ok(false),
                _ => Err(self.bad(key, &v, "expected true or false")),
            },
        }
    }

    /// A parameter that must be one of `choices`, or `default` when absent.
    pub fn choice(
        &mut self,
        key: &'static str,
        default: &'static str,
        choices: &[&'static str],
    ) -> Result<&'static str, ConfigError> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => choices
                .iter()
                .copied()
                .find(|c| c.eq_ignore_ascii_case(&v))
                .ok_or_else(|| {
                    self.bad(key, &v, format!("expected one of {}", choices.join(", ")))
                }),
        }
    }

    /// A column grouping (`shape`, `tensor` or a count, see [`crate::Columns`]), or
    /// `default` when absent; `unknown_run` is the run length `shape` falls back to when the
    /// shapes are unknown.
    pub fn columns(
        &mut self,
        key: &'static str,
        default: crate::Columns,
        unknown_run: usize,
    ) -> Result<crate::Columns, ConfigError> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => crate::Columns::parse(&v, unknown_run)
                .ok_or_else(|| self.bad(key, &v, "expected shape, tensor or a count in [1, 2^30]")),
        }
    }

    /// Refuses any parameter that no getter asked for.
    pub fn finish(self) -> Result<(), ConfigError> {
        if let Some(k) = self.values.keys().next() {
            let allowed = if self.allowed.is_empty() {
                "no parameters".to_string()
            } else {
                self.allowed.join(", ")
            };
            return Err(ConfigError::UnknownParam {
                codec: self.codec,
                param: k.clone(),
                allowed,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let mut p = Params::parse("qsgd:bits=4, bucket=512").unwrap();
        assert_eq!(p.codec(), "qsgd");
        assert_eq!(p.usize_in("bits", None, 1, 16).unwrap(), 4);
        assert_eq!(p.usize_in("bucket", Some(128), 1, 1 << 20).unwrap(), 512);
        p.finish().unwrap();

        let mut p = Params::parse("topk:ratio=2").unwrap();
        assert!(matches!(
            p.f64_in("ratio", None, 0.0, 1.0),
            Err(ConfigError::BadValue { .. })
        ));
        let mut p = Params::parse("topk").unwrap();
        assert!(matches!(
            p.f64_in("ratio", None, 0.0, 1.0),
            Err(ConfigError::MissingParam { .. })
        ));
        let mut p = Params::parse("topk:ratio=0.1,foo=1").unwrap();
        p.f64_in("ratio", None, 0.0, 1.0).unwrap();
        assert!(matches!(p.finish(), Err(ConfigError::UnknownParam { .. })));
        assert!(Params::parse("topk:ratio").is_err());
        assert!(Params::parse(":x=1").is_err());
        assert!(Params::parse("a:x=1,x=2").is_err());
    }
}
