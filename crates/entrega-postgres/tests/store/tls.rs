//! entrega's pools over TLS (rustls) to the test server, which `scripts/test` makes serve TLS
//! with the suite's own certificate authority (`ENTREGA_TEST_TLS_CA`): `sslmode=verify-full`
//! with that CA connects and the server sees an encrypted session; trusting only a CA that
//! did not sign the server's certificate, the connection is refused.

use crate::common;

use common::{server_url, TestResult};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// The suite's CA: `ENTREGA_TEST_TLS_CA`, else where `scripts/test` keeps it.
fn test_ca() -> String {
    let path = std::env::var("ENTREGA_TEST_TLS_CA").unwrap_or_else(|_| {
        format!(
            "{}/.cache/km0/tls/ca.pem",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    assert!(
        std::path::Path::new(&path).exists(),
        "no test CA at {path}: run scripts/test (or scripts/services start), which makes it \
         and turns TLS on in the test server"
    );
    path
}

/// The test server's URL with host `host` and TLS `params`.
fn tls_url(host: &str, params: &str) -> String {
    let server = server_url();
    let (scheme, rest) = server.split_once("://").unwrap_or(("postgres", &server));
    let (user, address) = rest.rsplit_once('@').unwrap_or(("postgres", rest));
    let port = address
        .split('/')
        .next()
        .and_then(|a| a.rsplit_once(':'))
        .map_or("5432", |(_, p)| p);
    format!("{scheme}://{user}@{host}:{port}/postgres?{params}")
}

#[tokio::test]
async fn verify_full_with_the_test_ca_encrypts_the_session() -> TestResult {
    let url = tls_url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", test_ca()),
    );
    let pool = entrega_postgres::connect(&url).await?;
    let (ssl, version): (bool, Option<String>) =
        sqlx::query_as("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await?;
    assert!(ssl, "the session is not encrypted");
    assert!(version.is_some_and(|v| v.starts_with("TLS")));
    pool.close().await;
    Ok(())
}

#[tokio::test]
async fn a_server_certificate_another_ca_signed_is_refused() -> TestResult {
    let dir = std::env::temp_dir().join(format!("entrega-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "a CA the server never saw");
    let other = params.self_signed(&KeyPair::generate()?)?;
    let other_ca = dir.join("other-ca.pem");
    std::fs::write(&other_ca, other.pem())?;

    let wrong_ca = tls_url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", other_ca.display()),
    );
    assert!(entrega_postgres::connect(&wrong_ca).await.is_err());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
