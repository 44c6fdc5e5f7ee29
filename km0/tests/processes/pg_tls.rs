//! km0 on PostgreSQL over TLS: the demo, every service's database and the log broker reached
//! with `sslmode=verify-full` and the test suite's certificate authority (which
//! `scripts/test` makes and turns on in the test server), holds every invariant. Under
//! `verify-full` a connection that is not encrypted, or whose certificate the CA did not
//! sign, fails instead of running.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use common::run_km0;

#[test]
fn the_demo_runs_with_every_database_connection_verified_tls() {
    let server = common::pg_server();
    let user = server
        .split_once("://")
        .and_then(|(_, rest)| rest.rsplit_once('@'))
        .map_or("postgres", |(u, _)| u)
        .to_owned();
    let port = server
        .rsplit_once(':')
        .map_or("5432", |(_, p)| p)
        .to_owned();
    let tls = format!("sslmode=verify-full&sslrootcert={}", common::tls::test_ca());
    let prefix = format!("km0tls{}_", std::process::id());
    let database = format!("postgres://{user}@localhost:{port}?{tls}");
    let broker = format!("postgres://{user}@localhost:{port}/{prefix}broker?{tls}");
    let (ok, text) = run_km0(
        &[
            "--database",
            &database,
            "--db-prefix",
            &prefix,
            "--broker",
            &broker,
            "demo",
            "--orders",
            "20",
            "--no-progress",
        ],
        &[],
    );
    assert!(ok, "{text}");
    // Trusting only a CA that signed nothing here, the same demo cannot even start.
    let dir = std::env::temp_dir().join(format!("km0-pgtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let other = common::tls::TestPki::new(&dir).other_ca;
    let wrong = format!(
        "postgres://{user}@localhost:{port}?sslmode=verify-full&sslrootcert={}",
        other.display()
    );
    let (ok, text) = run_km0(
        &[
            "--database",
            &wrong,
            "--db-prefix",
            &prefix,
            "--broker",
            &broker,
            "demo",
            "--orders",
            "1",
            "--no-progress",
        ],
        &[],
    );
    assert!(!ok, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
