//! TLS for km0's HTTP: the servers (pedidos, the gateway simulator, the operations endpoint)
//! serve HTTPS with a certificate and key given by flag, and the outgoing calls (pagos to
//! the gateway, reparto to the maps service, the OTLP exporter) trust an extra certificate
//! authority given by flag, besides the usual public roots. rustls throughout, with the
//! `ring` provider named explicitly so no process-wide default is needed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// A server's certificate chain and private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl ServerTls {
    /// An acceptor for the chain and key; unreadable or mismatched files are an error
    /// naming the file.
    pub fn acceptor(&self) -> anyhow::Result<TlsAcceptor> {
        let chain = certificates(&self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .with_context(|| format!("reading the private key in {}", self.key.display()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("choosing TLS versions")?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .with_context(|| {
                format!(
                    "the key in {} does not go with the certificate in {}",
                    self.key.display(),
                    self.cert.display()
                )
            })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// rustls with *ring*: no C toolchain beyond a compiler, the same provider reqwest and sqlx
/// use here. It offers no post-quantum key exchange (what rustls deprecates it for); the
/// aws-lc-rs provider would, at the cost of building AWS-LC (docs/SECURITY.md).
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file; none is an error.
fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates in {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading certificates in {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}

/// An HTTP client builder that also trusts the certificates in `ca` (PEM), when given.
pub fn client_builder(ca: Option<&Path>) -> anyhow::Result<reqwest::ClientBuilder> {
    let mut builder = reqwest::Client::builder().use_rustls_tls();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        let roots = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("reading certificates in {}", ca.display()))?;
        anyhow::ensure!(!roots.is_empty(), "no certificate in {}", ca.display());
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
    }
    Ok(builder)
}
