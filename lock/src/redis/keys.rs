//! The names that go with a lock key on Redis: its fence counter and its release channel
//! (public for operators and tests that look at, or set back, a counter), and Redis lock
//! key validation.
//!
//! Both keys of one lock must live on the same Redis Cluster node, because the acquire
//! script touches both atomically; the release channel is named the same way, so that it
//! hashes to the lock's slot too. Redis Cluster places a key by its *hash tag*: the part
//! between the first `{` and the next `}` when that part is non-empty, else the whole key.

use crate::error::{Error, Result};

/// The key of the fence counter that belongs to lock `key`.
///
/// `lock_sale_1` hashes on `lock_sale_1`, and so does `{lock_sale_1}:fence`. A key that
/// already carries a hash tag (`{user:7}:cart`) keeps it: its fence key is `{user:7}:cart:fence`.
///
/// # Errors
/// [`Error::InvalidKey`] when the key is empty; when it ends like a fence key or a release
/// channel (`:fence`, `:released`); when it is nothing but a hash tag (`{x}`, whose fence key
/// would be that of `x`); or when no fence key can share its slot (a key with a stray `}` and
/// no hash tag of its own, such as `a}b`).
pub fn fence_key(key: &str) -> Result<String> {
    companion(key, "fence")
}

/// Whether `key` can be a lock key on Redis (see [`fence_key`]), without building its fence
/// key: every call checks its key, and a key that passes costs no allocation.
pub(crate) fn check(key: &str) -> Result<()> {
    match refusal(key) {
        None => Ok(()),
        Some(reason) => Err(Error::InvalidKey {
            key: key.to_owned(),
            reason,
        }),
    }
}

/// The pub/sub channel on which the release of lock `key` is announced
/// (`{lock_sale_1}:released`), named like [`fence_key`] so that it hashes to the lock's slot.
///
/// # Errors
/// As [`fence_key`].
pub fn release_channel(key: &str) -> Result<String> {
    companion(key, "released")
}

/// `key` with `:<suffix>`, wrapped in a hash tag when the key has none, so both hash alike.
fn companion(key: &str, suffix: &str) -> Result<String> {
    check(key)?;
    let tagged = hash_tag(key) != key;
    let mut name = String::with_capacity(key.len() + suffix.len() + 3);
    if tagged {
        name.push_str(key);
    } else {
        name.push('{');
        name.push_str(key);
        name.push('}');
    }
    name.push(':');
    name.push_str(suffix);
    debug_assert_eq!(hash_tag(&name), hash_tag(key));
    Ok(name)
}

/// Why `key` cannot be a lock key on Redis, if it cannot.
fn refusal(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        return Some("the key is empty");
    }
    // `{x}:fence` is the fence counter of lock `x`: taken as a lock key, it would hold a
    // token where the counter is, and lock `x` could never be taken again.
    if key.ends_with(":fence") || key.ends_with(":released") {
        return Some("it ends like a fence key or a release channel (`:fence`, `:released`)");
    }
    let tag = hash_tag(key);
    // `{x}` (a key that is nothing but a hash tag) would get `{x}:fence`, which is also the
    // fence key of the plain key `x`: two locks sharing one counter and one channel. Its tag
    // is everything between its first and last characters.
    if key.starts_with('{') && key.ends_with('}') && tag.len() + 2 == key.len() {
        return Some(
            "a key that is only a hash tag ({x}) would share its fence key with the key x; put something outside the braces, such as {x}:lock",
        );
    }
    // A key with no hash tag of its own is wrapped in one, `{key}:fence`, which Redis hashes
    // on `key` only if `key` holds no `}` (the tag would end there: `a}b` gives `{a}b}:fence`,
    // hashed on `a`). A key with a tag keeps it, suffix and all.
    if tag == key && key.contains('}') {
        return Some("its fence key cannot share its cluster slot; use a hash tag such as {name}");
    }
    None
}

/// The part of `key` that Redis Cluster hashes to choose a slot.
pub(crate) fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_key_gets_its_fence_in_the_same_slot() {
        let fence = fence_key("lock_sale_1").unwrap();
        assert_eq!(fence, "{lock_sale_1}:fence");
        assert_eq!(hash_tag(&fence), hash_tag("lock_sale_1"));
    }

    #[test]
    fn a_key_with_a_hash_tag_keeps_it() {
        let fence = fence_key("{user:7}:cart").unwrap();
        assert_eq!(fence, "{user:7}:cart:fence");
        assert_eq!(hash_tag(&fence), "user:7");
    }

    #[test]
    fn keys_with_braces_but_no_tag_still_share_a_slot_or_are_refused() {
        for key in ["a{b", "a{}b", "{}", "x{", "a}b"] {
            match fence_key(key) {
                Ok(fence) => assert_eq!(hash_tag(&fence), hash_tag(key), "{key}"),
                Err(Error::InvalidKey { .. }) => assert!(key.contains('}'), "{key}"),
                Err(other) => panic!("{key}: {other}"),
            }
        }
    }

    #[test]
    fn the_release_channel_hashes_like_the_lock() {
        assert_eq!(
            release_channel("lock_sale_1").unwrap(),
            "{lock_sale_1}:released"
        );
        assert_eq!(
            release_channel("{user:7}:cart").unwrap(),
            "{user:7}:cart:released"
        );
    }

    #[test]
    fn a_key_named_like_another_locks_fence_or_channel_is_refused() {
        for key in ["{x}:fence", "{u}:a:fence", "lock:released"] {
            assert!(
                matches!(fence_key(key), Err(Error::InvalidKey { .. })),
                "{key}"
            );
        }
    }

    #[test]
    fn a_plain_key_and_the_same_name_in_braces_do_not_share_a_fence_or_a_channel() {
        for (plain, tagged) in [
            ("x", "{x}"),
            ("lock_sale_1", "{lock_sale_1}"),
            ("a{b", "{a{b}"),
        ] {
            let (fence, channel) = (fence_key(plain).unwrap(), release_channel(plain).unwrap());
            match (fence_key(tagged), release_channel(tagged)) {
                (Ok(other_fence), Ok(other_channel)) => {
                    assert_ne!(fence, other_fence, "{plain} and {tagged}");
                    assert_ne!(channel, other_channel, "{plain} and {tagged}");
                }
                (Err(Error::InvalidKey { .. }), Err(Error::InvalidKey { .. })) => {}
                other => panic!("{tagged}: {other:?}"),
            }
        }
        // A tag with something beside it is a key like any other.
        assert_eq!(fence_key("{x}:lock").unwrap(), "{x}:lock:fence");
    }

    /// The rule as first written: build the fence key and compare the two hash tags (after
    /// the checks for a companion's name and for a key that is only a hash tag); the reason
    /// of the first check that refuses.
    fn refusal_by_building(key: &str) -> Option<&'static str> {
        if key.is_empty() {
            return Some("the key is empty");
        }
        if key.ends_with(":fence") || key.ends_with(":released") {
            return Some("it ends like a fence key or a release channel (`:fence`, `:released`)");
        }
        if key.len() > 2 && key == format!("{{{}}}", hash_tag(key)) {
            return Some(
                "a key that is only a hash tag ({x}) would share its fence key with the key x; put something outside the braces, such as {x}:lock",
            );
        }
        let name = if hash_tag(key) == key {
            format!("{{{key}}}:fence")
        } else {
            format!("{key}:fence")
        };
        (hash_tag(&name) != hash_tag(key))
            .then_some("its fence key cannot share its cluster slot; use a hash tag such as {name}")
    }

    #[test]
    fn the_check_that_builds_nothing_refuses_what_building_refused_and_says_the_same() {
        // Every key of up to six characters from `{`, `}`, `a` and `:`; keys that two rules
        // refuse (the first rule's reason is the one given); keys with characters of several
        // bytes.
        let mut keys = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..6 {
            last = last
                .iter()
                .flat_map(|k| ['{', '}', 'a', ':'].map(|c| format!("{k}{c}")))
                .collect();
            keys.extend(last.iter().cloned());
        }
        keys.extend(
            [
                "a}:fence",
                "}:released",
                "{}:fence",
                "{a}:fence",
                "é}b",
                "{é}",
                "{é}x",
                "é{b}",
                "}é",
            ]
            .map(String::from),
        );
        for key in &keys {
            assert_eq!(refusal(key), refusal_by_building(key), "{key:?}");
            match fence_key(key) {
                Ok(fence) => {
                    assert_eq!(hash_tag(&fence), hash_tag(key), "{key:?}");
                    assert_eq!(hash_tag(&release_channel(key).unwrap()), hash_tag(key));
                }
                Err(Error::InvalidKey { reason, .. }) => {
                    assert_eq!(Some(reason), refusal_by_building(key), "{key:?}")
                }
                Err(other) => panic!("{key:?}: {other}"),
            }
        }
    }

    #[test]
    fn an_empty_key_is_refused() {
        assert!(matches!(fence_key(""), Err(Error::InvalidKey { .. })));
    }
}
