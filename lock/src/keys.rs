//! The key checks shared by every backend that names a lock after its key (the PostgreSQL
//! table, ZooKeeper, etcd). Redis's own key names live in `redis::keys`.

use crate::error::{Error, Result};

/// The checks of a backend that names a lock after its key (the PostgreSQL table, ZooKeeper,
/// etcd): not empty, at most `max_bytes` long (`too_long` says so), and whatever else the
/// store refuses (`refused` names it).
pub(crate) fn check_name(
    key: &str,
    max_bytes: usize,
    too_long: &'static str,
    refused: impl Fn(&str) -> Option<&'static str>,
) -> Result<()> {
    let reason = if key.is_empty() {
        Some("the key is empty")
    } else if key.len() > max_bytes {
        Some(too_long)
    } else {
        refused(key)
    };
    match reason {
        Some(reason) => Err(Error::InvalidKey {
            key: key.chars().take(64).collect(),
            reason,
        }),
        None => Ok(()),
    }
}
