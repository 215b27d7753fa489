//! [`TestAuthority`]: a certificate authority made for one test, and the certificates it
//! issues to the private servers the test starts.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use servers::ServerCertificate;

/// A certificate authority nobody else trusts: a client told to trust its certificate
/// ([`ca_pem`](Self::ca_pem)) accepts the servers it issued to, and refuses any other.
pub struct TestAuthority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestAuthority {
    /// A new authority named `name` (its certificate's common name), with a fresh key.
    ///
    /// # Panics
    /// If the key or the certificate cannot be made (never, with rcgen's defaults).
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names to check");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a key pair");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a self-signed authority"),
        }
    }

    /// Its certificate, PEM: what a client is told to trust.
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for a server on this machine: valid for `localhost` and `127.0.0.1`,
    /// for server authentication, with a fresh key.
    ///
    /// # Panics
    /// As [`new`](Self::new).
    pub fn issue_for_localhost(&self) -> ServerCertificate {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let mut params = CertificateParams::new(names).expect("valid names");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("a key pair");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a certificate signed by the authority");
        ServerCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}
