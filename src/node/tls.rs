//! TLS for `rediss://` nodes (feature `tls`): what a client trusts and what
//! it presents ([`Tls`]), the crypto provider rustls needs, and how a
//! failed handshake is told apart from a failed TCP connect.
//!
//! The connection itself is the `redis` crate's (`tokio-rustls-comp`):
//! this file only configures it and reads its errors. Why rustls and not
//! native-tls: no system OpenSSL to link or to keep patched, the same
//! behaviour on every platform, and the `redis` crate's rustls path accepts
//! a custom CA and a client certificate from memory (PEM bytes), which is
//! what a service holding its certificates in a secret store has.

use std::fmt;

/// The certificates a client trusts and presents on its `rediss://` nodes
/// (feature `tls`), given to [`Builder::tls`](crate::Builder::tls).
///
/// Without a CA, a `rediss://` node's certificate is checked against the
/// system's trust store (`rustls-native-certs`), as a browser would. Its
/// `Debug` never shows the key.
///
/// ```
/// # fn load(_: &str) -> Vec<u8> { Vec::new() }
/// let tls = redfence::Tls::new()
///     .root_ca_pem(load("ca.pem"))
///     .client_identity_pem(load("client.pem"), load("client.key"));
/// # let _ = tls;
/// ```
#[derive(Clone, Default)]
#[must_use]
pub struct Tls {
    root_ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl Tls {
    /// Trusts the system's certificate store and presents no client
    /// certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts only the CA certificates in `pem` (one or more PEM blocks)
    /// instead of the system's store: a private CA, as self-hosted and most
    /// managed Redis deployments use.
    pub fn root_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_ca = Some(pem.into());
        self
    }

    /// Presents this certificate chain and private key (PEM) to servers that
    /// ask for one (mutual TLS, `tls-auth-clients yes`).
    pub fn client_identity_pem(
        mut self,
        cert_chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some((cert_chain_pem.into(), key_pem.into()));
        self
    }

    /// In the form `redis::Client::build_with_tls` takes, once each PEM
    /// that should hold a certificate holds one: the `redis` crate reads a
    /// text without any as an empty list, which would trust nothing and
    /// fail every handshake later with a less helpful message.
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> Result<redis::TlsCertificates, redis::RedisError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let holds_certificates = |pem: &[u8]| {
            let mut certs = CertificateDer::pem_slice_iter(pem);
            matches!(certs.next(), Some(Ok(_))) && certs.all(|c| c.is_ok())
        };
        let none = |what| redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, what));
        if self
            .root_ca
            .as_deref()
            .is_some_and(|pem| !holds_certificates(pem))
        {
            return Err(none("the CA PEM holds no certificate"));
        }
        if self
            .client
            .as_ref()
            .is_some_and(|(cert, _)| !holds_certificates(cert))
        {
            return Err(none("the client certificate PEM holds no certificate"));
        }
        Ok(redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_ca.clone(),
        })
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("root_ca", &self.root_ca.as_ref().map(|_| "<pem>"))
            .field(
                "client_identity",
                &self.client.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// rustls needs a process-wide crypto provider and panics without one (it
/// picks one by itself only when exactly one of its provider features is
/// compiled in, which another crate in the application can change). The
/// `tls` feature compiles in `ring`; it is installed when a client with a
/// `rediss://` node is built, unless the application installed one first
/// (then that one is used).
#[cfg(feature = "tls")]
pub(crate) fn ensure_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(not(feature = "tls"))]
pub(crate) fn ensure_provider() {}

/// What rustls said, if `error` is a TLS handshake failure (an untrusted,
/// expired or wrong-host certificate, a refused client certificate, bytes
/// that are not TLS) rather than a TCP-level one.
#[cfg(feature = "tls")]
pub(crate) fn handshake_error(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = rustls_inside(e) {
            return Some(describe(tls));
        }
        next = e.source();
    }
    None
}

/// rustls's words, with what they mean for the two failures a deployment
/// meets most (an untrusted server, a refused client certificate).
#[cfg(feature = "tls")]
fn describe(error: &rustls::Error) -> String {
    use rustls::{AlertDescription as Alert, CertificateError, Error};
    match error {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            format!("the server's certificate is not signed by a CA this client trusts ({error})")
        }
        Error::AlertReceived(
            Alert::CertificateRequired
            | Alert::UnknownCA
            | Alert::BadCertificate
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::CertificateRevoked
            | Alert::AccessDenied,
        ) => format!("the server refused this client's certificate ({error})"),
        _ => error.to_string(),
    }
}

/// `e` as a rustls error, looking through the two wrappers the `source`
/// chain skips: an `io::Error`'s payload (its `source` is the payload's
/// source, not the payload) and the `Arc` a `redis::RedisError` keeps its
/// cause in (which downcasts as the `Arc`, not as what it holds).
#[cfg(feature = "tls")]
fn rustls_inside<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        let inner: &(dyn std::error::Error + 'static) = io.get_ref()?;
        return rustls_inside(inner);
    }
    if let Some(shared) = e.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>() {
        let inner: &(dyn std::error::Error + 'static) = &**shared;
        return rustls_inside(inner);
    }
    None
}

#[cfg(not(feature = "tls"))]
pub(crate) fn handshake_error(_: &(dyn std::error::Error + 'static)) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_key_material() {
        let tls = Tls::new()
            .root_ca_pem("-----BEGIN CERTIFICATE-----CA")
            .client_identity_pem("CERT", "-----BEGIN PRIVATE KEY-----SECRET");
        let shown = format!("{tls:?}");
        assert!(
            !shown.contains("SECRET") && !shown.contains("CERT"),
            "{shown}"
        );
        assert!(shown.contains("root_ca: Some"), "{shown}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn finds_the_rustls_error_inside_an_io_error() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let redis = redis::RedisError::from(io);
        let found = handshake_error(&redis);
        assert!(
            found
                .as_deref()
                .is_some_and(|m| m.to_lowercase().contains("expired")),
            "{found:?}"
        );
        // Also behind the Arc a RedisError keeps its cause in, and as the
        // error itself.
        let bare = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert!(handshake_error(&bare).is_some_and(|m| m.contains("not signed by a CA")));
        let plain =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(handshake_error(&plain), None);
    }
}
