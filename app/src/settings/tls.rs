//! Certificate authorities the service trusts on its links to Redis and etcd, read from PEM
//! files when the settings are parsed. (PostgreSQL's is named in `DATABASE_URL` itself:
//! `sslmode=verify-full&sslrootcert=<file>`.) Without one, a TLS link checks the server's
//! certificate against the system's trusted authorities.

use std::path::PathBuf;
use std::sync::Arc;

/// A PEM file of one or more certificate authorities.
#[derive(Clone)]
pub struct CaFile {
    /// Where it was read from, for messages.
    pub path: PathBuf,
    /// What it holds, PEM.
    pub pem: Arc<[u8]>,
}

impl std::fmt::Debug for CaFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CaFile").field(&self.path).finish()
    }
}

/// Read `raw`, a file that must hold at least one PEM certificate; the message names it.
pub(super) fn ca_file(raw: &str) -> Result<CaFile, String> {
    let pem = std::fs::read(raw).map_err(|e| format!("cannot read {raw}: {e}"))?;
    let marker: &[u8] = b"-----BEGIN CERTIFICATE-----";
    if !pem.windows(marker.len()).any(|window| window == marker) {
        return Err(format!(
            "{raw} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(CaFile {
        path: PathBuf::from(raw),
        pem: pem.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_certificate_is_refused_by_name() {
        let path = std::env::temp_dir().join(format!("seckill-ca-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate\n").unwrap();
        let raw = path.display().to_string();

        let refused = ca_file(&raw).unwrap_err();
        let missing = ca_file("/nonexistent/ca.pem").unwrap_err();
        std::fs::write(
            &path,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let read = ca_file(&raw);
        std::fs::remove_file(&path).unwrap();

        assert!(
            refused.contains(&raw) && refused.contains("no PEM certificate"),
            "{refused}"
        );
        assert!(
            missing.contains("cannot read /nonexistent/ca.pem"),
            "{missing}"
        );
        assert!(read.is_ok_and(|ca| ca.path == path && ca.pem.starts_with(b"-----BEGIN")));
    }
}
