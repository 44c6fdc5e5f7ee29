//! A certificate authority of the test's own, and certificates it signs, as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// PEM files of a test CA and of one server certificate it signed.
pub struct TestPki {
    /// The CA's certificate: what clients trust.
    pub ca: PathBuf,
    /// The server's certificate (for `localhost` and 127.0.0.1).
    pub cert: PathBuf,
    /// The server's private key (PKCS#8).
    pub key: PathBuf,
    /// A second CA that signed nothing here: a client trusting only it must refuse.
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

impl TestPki {
    /// Makes the CA and a server certificate for `localhost` and 127.0.0.1 in `dir`.
    pub fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let (ca_cert, ca_key) = ca("km0 test CA");
        let (other, _) = ca("another CA");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        Self {
            ca: write("ca.pem", ca_cert.pem()),
            cert: write("server.pem", cert.pem()),
            key: write("server-key.pem", key.serialize_pem()),
            other_ca: write("other-ca.pem", other.pem()),
        }
    }

    /// The CA's certificate as reqwest takes it.
    pub fn ca_certificate(&self) -> reqwest::Certificate {
        reqwest::Certificate::from_pem(&std::fs::read(&self.ca).unwrap()).unwrap()
    }
}

/// The certificate authority `scripts/test` makes for the shared PostgreSQL and RabbitMQ:
/// `ENTREGA_TEST_TLS_CA`, else where the script keeps it.
pub fn test_ca() -> String {
    let path = std::env::var("ENTREGA_TEST_TLS_CA").unwrap_or_else(|_| {
        format!(
            "{}/.cache/km0/tls/ca.pem",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    assert!(
        Path::new(&path).exists(),
        "no test CA at {path}: run scripts/test (or scripts/services start), which makes it"
    );
    path
}
