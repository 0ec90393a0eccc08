//! Host names: the one place where a name from an allowlist, a DNS question, a TLS SNI or an HTTP Host
//! header is normalised and validated.
//!
//! Every decision in the project compares [`HostName`]s, and a `HostName` can only be built by
//! [`HostName::parse`], so there is exactly one normalisation (ASCII lowercase, one trailing dot dropped)
//! and one alphabet check. Anything outside the hostname alphabet (NUL, `/`, `@`, `*`, `%`, spaces, CR/LF,
//! non-ASCII) and any IP literal is rejected here, before a policy is ever consulted.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest name DNS can carry, without the trailing dot.
pub const MAX_NAME_LEN: usize = 253;
/// The longest label DNS can carry.
pub const MAX_LABEL_LEN: usize = 63;

/// A validated, normalised host name: lowercase ASCII labels of `a-z 0-9 - _`, no trailing dot.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostName(String);

/// Why a string is not a host name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Nothing (or only a dot) was given.
    #[error("the name is empty")]
    Empty,
    /// An IPv4 or IPv6 literal (bracketed or not) where a name was expected.
    #[error("`{0}` is an IP address, not a host name")]
    IpLiteral(String),
    /// A character outside ASCII; internationalised names must be written in punycode.
    #[error("the name has a non-ASCII character {0:?}; write internationalised names in punycode (xn--...)")]
    NonAscii(char),
    /// `*` anywhere in the name.
    #[error("`*` is not allowed in a host name")]
    Wildcard,
    /// A character outside `a-z 0-9 - _ .`.
    #[error("the name has the character {0:?}, which is not allowed in a host name (a-z, 0-9, '-', '_', '.')")]
    BadChar(char),
    /// Two dots in a row, or a leading dot.
    #[error("the name has an empty label (a leading dot or two dots in a row)")]
    EmptyLabel,
    /// A label longer than 63 characters.
    #[error("the label `{0}` is longer than 63 characters")]
    LabelTooLong(String),
    /// A label that begins or ends with `-`.
    #[error("the label `{0}` begins or ends with '-'")]
    LabelHyphen(String),
    /// More than 253 characters.
    #[error("the name is {0} characters long; the limit is 253")]
    TooLong(usize),
    /// The last label is all digits: not a name any public or internal DNS has, and what `inet_aton`
    /// would read as an address (`127.1`).
    #[error(
        "`{0}` looks like a numeric address: the last label of a host name cannot be all digits"
    )]
    NumericTld(String),
}

impl HostName {
    /// Normalises and validates `raw`: ASCII lowercase, one trailing dot dropped, then the alphabet,
    /// label and length rules. IP literals are refused.
    pub fn parse(raw: &str) -> Result<HostName, NameError> {
        if let Some(c) = raw.chars().find(|c| !c.is_ascii()) {
            return Err(NameError::NonAscii(c));
        }
        if is_ip_literal(raw) {
            return Err(NameError::IpLiteral(raw.to_owned()));
        }
        let trimmed = raw.strip_suffix('.').unwrap_or(raw);
        if trimmed.is_empty() {
            return Err(NameError::Empty);
        }
        let name = trimmed.to_ascii_lowercase();
        if let Some(c) = name.chars().find(|c| !is_name_char(*c)) {
            return Err(if c == '*' {
                NameError::Wildcard
            } else {
                NameError::BadChar(c)
            });
        }
        if name.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong(name.len()));
        }
        for label in name.split('.') {
            if label.is_empty() {
                return Err(NameError::EmptyLabel);
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(NameError::LabelTooLong(label.to_owned()));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(NameError::LabelHyphen(label.to_owned()));
            }
        }
        let last = name.rsplit('.').next().unwrap_or_default();
        if last.bytes().all(|b| b.is_ascii_digit()) {
            return Err(NameError::NumericTld(name));
        }
        Ok(HostName(name))
    }

    /// The normalised name, without a trailing dot.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parent names, nearest first: `a.b.c` yields `b.c`, then `c`.
    pub fn parents(&self) -> impl Iterator<Item = &str> {
        self.0
            .match_indices('.')
            .map(move |(i, _)| &self.0[i + 1..])
    }

    /// True when `self` is `other` or a subdomain of it at any depth.
    #[must_use]
    pub fn is_within(&self, other: &HostName) -> bool {
        self == other || self.parents().any(|p| p == other.as_str())
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for HostName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostName::parse(s)
    }
}

impl AsRef<str> for HostName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_' || c == '.'
}

/// True for `1.2.3.4`, `::1`, `[::1]`, with or without one trailing dot.
#[must_use]
pub fn is_ip_literal(raw: &str) -> bool {
    let s = raw.strip_suffix('.').unwrap_or(raw);
    let s = s
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(s);
    s.parse::<Ipv4Addr>().is_ok() || s.parse::<Ipv6Addr>().is_ok() || s.parse::<IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let ok = [
            ("api.anthropic.com", "api.anthropic.com"),
            ("API.Anthropic.COM.", "api.anthropic.com"),
            ("vault.service.consul", "vault.service.consul"),
            ("_srv.example.com", "_srv.example.com"),
            ("localhost", "localhost"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("a1.b2", "a1.b2"),
            ("1password.com", "1password.com"),
        ];
        for (input, want) in ok {
            assert_eq!(HostName::parse(input).unwrap().as_str(), want, "{input}");
        }
        let bad: &[(&str, NameError)] = &[
            ("", NameError::Empty),
            (".", NameError::Empty),
            ("1.2.3.4", NameError::IpLiteral("1.2.3.4".into())),
            ("::1", NameError::IpLiteral("::1".into())),
            ("[::1]", NameError::IpLiteral("[::1]".into())),
            ("127.1", NameError::NumericTld("127.1".into())),
            ("bücher.de", NameError::NonAscii('ü')),
            ("*.example.com", NameError::Wildcard),
            ("a b.com", NameError::BadChar(' ')),
            ("a\0.com", NameError::BadChar('\0')),
            ("a/b.com", NameError::BadChar('/')),
            ("user@b.com", NameError::BadChar('@')),
            ("a%2e.com", NameError::BadChar('%')),
            ("a.com\r\n", NameError::BadChar('\r')),
            ("a.com:443", NameError::BadChar(':')),
            ("a..com", NameError::EmptyLabel),
            (".a.com", NameError::EmptyLabel),
            ("a.com..", NameError::EmptyLabel),
            ("-a.com", NameError::LabelHyphen("-a".into())),
            ("a-.com", NameError::LabelHyphen("a-".into())),
        ];
        for (input, want) in bad {
            assert_eq!(HostName::parse(input).unwrap_err(), *want, "{input:?}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        assert!(matches!(
            HostName::parse(&long_label),
            Err(NameError::LabelTooLong(_))
        ));
        let long_name = format!("{}com", "abcdefghi.".repeat(26));
        assert!(matches!(
            HostName::parse(&long_name),
            Err(NameError::TooLong(263))
        ));
        let max_name = format!("{0}.{0}.{0}.{1}", "a".repeat(63), "b".repeat(61));
        assert_eq!(max_name.len(), MAX_NAME_LEN);
        assert!(HostName::parse(&max_name).is_ok());
        assert!(HostName::parse(&format!("{max_name}.")).is_ok());
    }

    #[test]
    fn parents_and_within() {
        let n = HostName::parse("a.b.example.com").unwrap();
        assert_eq!(
            n.parents().collect::<Vec<_>>(),
            ["b.example.com", "example.com", "com"]
        );
        let apex = HostName::parse("example.com").unwrap();
        assert!(n.is_within(&apex));
        assert!(apex.is_within(&apex));
        assert!(!HostName::parse("badexample.com").unwrap().is_within(&apex));
        assert!(!HostName::parse("example.com.evil.com")
            .unwrap()
            .is_within(&apex));
        assert!(!HostName::parse("example.comx").unwrap().is_within(&apex));
    }
}
