//! Checked input: each type can only hold a valid value, made by `parse`.

use std::fmt;

/// A product id from a path segment: a positive 64-bit integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProductId(i64);

impl ProductId {
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw.parse::<i64>() {
            Ok(id) if id > 0 => Ok(Self(id)),
            // The parsed value, not `raw`: "-000…01" parses, and would echo a path of any length.
            Ok(id) => Err(format!("product id must be positive, got {id}")),
            Err(_) => Err(format!(
                "product id must be a positive integer below 2^63, got {:?}",
                shortened(raw, 32)
            )),
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for ProductId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A buyer: a positive 64-bit integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UserId(i64);

impl UserId {
    pub fn parse(raw: i64) -> Result<Self, String> {
        if raw > 0 {
            Ok(Self(raw))
        } else {
            Err(format!("user_id must be positive, got {raw}"))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// How many units one purchase takes: 1 to `MAX_QUANTITY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity(i32);

impl Quantity {
    pub fn parse(raw: i64, max: u32) -> Result<Self, String> {
        if raw >= 1 && raw <= i64::from(max) {
            Ok(Self(raw as i32))
        } else {
            Err(format!("quantity must be between 1 and {max}, got {raw}"))
        }
    }

    pub fn get(self) -> i32 {
        self.0
    }
}

/// Units in stock: 0 to [`Stock::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stock(i64);

impl Stock {
    pub const MAX: i64 = 1_000_000_000;

    pub fn parse(raw: i64) -> Result<Self, String> {
        if (0..=Self::MAX).contains(&raw) {
            Ok(Self(raw))
        } else {
            Err(format!(
                "stock must be between 0 and {}, got {raw}",
                Self::MAX
            ))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// A product name: 1 to 200 characters, not blank, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductName(String);

impl ProductName {
    pub const MAX_CHARS: usize = 200;

    pub fn parse(raw: String) -> Result<Self, String> {
        if raw.trim().is_empty() {
            return Err("name must not be empty".into());
        }
        let chars = raw.chars().count();
        if chars > Self::MAX_CHARS {
            return Err(format!(
                "name must be at most {} characters, got {chars}",
                Self::MAX_CHARS
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err("name must not contain control characters".into());
        }
        Ok(Self(raw))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// At most `max_chars` characters of `text`, with "…" where it was cut: bad input is echoed
/// back only this far, so an answer never carries a client's megabyte back to it.
pub fn shortened(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_ids_must_be_positive_integers_that_fit() {
        assert_eq!(ProductId::parse("42").unwrap().get(), 42);
        for bad in ["0", "-1", "abc", "1.5", "", "9223372036854775808", " 1"] {
            assert!(ProductId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bad_product_id_is_echoed_short_however_long_it_was() {
        let zeros = "0".repeat(5_000);
        for long in [
            format!("-{zeros}1"),
            format!("x{zeros}"),
            format!("{zeros}0"),
        ] {
            let message = ProductId::parse(&long).unwrap_err();
            assert!(message.len() < 100, "{message}");
        }
        assert_eq!(shortened("héllo", 2), "hé…");
        assert_eq!(shortened("héllo", 5), "héllo");
    }

    #[test]
    fn quantities_are_bounded_by_the_maximum() {
        assert_eq!(Quantity::parse(5, 5).unwrap().get(), 5);
        for bad in [0, -1, 6, i64::MAX] {
            assert!(Quantity::parse(bad, 5).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_must_be_short_and_printable() {
        assert!(ProductName::parse("Phone".into()).is_ok());
        assert!(ProductName::parse("é".repeat(200)).is_ok());
        for bad in ["", "   ", "a\u{0}b", "line\nbreak"] {
            assert!(ProductName::parse(bad.into()).is_err(), "{bad:?}");
        }
        assert!(ProductName::parse("x".repeat(201)).is_err());
    }

    #[test]
    fn stock_and_users_are_checked() {
        assert!(Stock::parse(0).is_ok());
        assert!(Stock::parse(-1).is_err());
        assert!(Stock::parse(Stock::MAX + 1).is_err());
        assert!(UserId::parse(0).is_err());
        assert!(UserId::parse(7).is_ok());
    }
}
