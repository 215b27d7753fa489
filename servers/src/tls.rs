//! [`ServerCertificate`]: what a private server presents to its clients over TLS.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::Result;

/// A server's certificate (PEM, the chain up to but not including its authority's) and its
/// private key (PEM). The caller makes both: a test, with a certificate authority of its
/// own that its clients are told to trust.
#[derive(Clone)]
pub struct ServerCertificate {
    pub cert_pem: String,
    pub key_pem: String,
}

impl ServerCertificate {
    /// Write both into `dir` as `server.crt` and `server.key`, the key readable by its
    /// owner only (PostgreSQL refuses one others can read), both owned by `account` when
    /// given (the server runs as it). Returns the two paths.
    pub(crate) fn write_to(
        &self,
        dir: &Path,
        account: Option<(u32, u32)>,
    ) -> Result<(PathBuf, PathBuf)> {
        let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
        let what = "writing a private server's certificate";
        std::fs::write(&cert, &self.cert_pem).map_err(crate::io(what))?;
        // Made readable by its owner only, never for a moment by anyone else.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key)
            .and_then(|mut file| file.write_all(self.key_pem.as_bytes()))
            .map_err(crate::io(what))?;
        if let Some((uid, gid)) = account {
            for file in [&cert, &key] {
                std::os::unix::fs::chown(file, Some(uid), Some(gid)).map_err(crate::io(what))?;
            }
        }
        Ok((cert, key))
    }
}
