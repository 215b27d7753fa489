//! The random value that marks one acquisition as ours.

/// 128 random bits from a CSPRNG, hex-encoded: new for every acquisition, so no two
/// acquisitions, even of the same owner, share a token. Only the token's holder can renew,
/// release or advance the fence of the lock it marks.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A fresh token.
    pub fn new() -> Self {
        // Written into a buffer of its size, then copied once (`hex::encode` pushes it onto a
        // `String` one character at a time).
        let mut hex = [0u8; 32];
        hex::encode_to_slice(rand::random::<[u8; 16]>(), &mut hex)
            .expect("32 bytes hold 16 in hex");
        Self(std::str::from_utf8(&hex).expect("hex is ASCII").to_owned())
    }

    /// The token as stored in the backend (for backends).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The whole token, to compare with what a backend holds. Whoever has it can release
    /// the lock it marks: never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Default for Token {
    fn default() -> Self {
        Self::new()
    }
}

impl Token {
    /// Move the token out, leaving an empty one (for `Drop`, which then spawns the release).
    pub(crate) fn take(&mut self) -> Self {
        Self(std::mem::take(&mut self.0))
    }
}

impl std::fmt::Debug for Token {
    /// Shows a prefix only: a full token in a log line would let a reader release the lock.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({}…)", self.0.get(..8).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_new_every_time_and_debug_shows_only_a_prefix() {
        let (a, b) = (Token::new(), Token::new());
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(
            a.as_str()
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "not lowercase hex"
        );
        let shown = format!("{a:?}");
        assert!(!shown.contains(a.as_str()), "{shown}");
    }
}
