//! TLS for the HTTP port: a certificate chain and key read from PEM files
//! into a rustls acceptor (ring provider, the one reqwest already uses).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

/// Where the HTTP port's certificate and key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// The private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM.
    #[error("cannot read the TLS {what} {path}: {reason}; pass a PEM file to --tls-{what}")]
    File {
        /// `cert` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The certificate and key do not make a usable configuration.
    #[error(
        "the TLS certificate {cert} and key {key} cannot be used together: {reason}; check that the key belongs to the certificate"
    )]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        reason: String,
    },
}

fn file_error(what: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        what,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

impl TlsFiles {
    /// Reads both files into an acceptor.
    pub fn acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let pem = std::fs::read(&self.cert).map_err(|e| file_error("cert", &self.cert, e))?;
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_error("cert", &self.cert, e))?;
        if chain.is_empty() {
            return Err(file_error("cert", &self.cert, "no CERTIFICATE block in it"));
        }
        let pem = std::fs::read(&self.key).map_err(|e| file_error("key", &self.key, e))?;
        let key =
            PrivateKeyDer::from_pem_slice(&pem).map_err(|e| file_error("key", &self.key, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| TlsError::Config {
                cert: self.cert.clone(),
                key: self.key.clone(),
                reason: e.to_string(),
            })?;
        let mut config = config;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}
