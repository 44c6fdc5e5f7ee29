//! Least privilege: the role a service runs as may read and write the tables of its own
//! database and nothing else. It cannot create, alter or drop anything, cannot create
//! databases or roles, cannot connect to another service's database, may only append to the
//! audit tables, and only reads the migration records. The owner (who runs the migrations)
//! grants this once per migration run, so tables a new migration adds are covered.

use entrega_core::StoreError;
use sqlx::postgres::PgPool;

use crate::errors::{classify, invalid};

/// Tables a service may read and append to, never change: the operators' audit and the
/// saga history.
pub const APPEND_ONLY: [&str; 2] = ["entrega_dlq_audit", "entrega_saga_history"];

/// Tables a service may only read: the migration records.
pub const READ_ONLY: [&str; 1] = ["entrega_migrations"];

/// Whether `name` may be used as a role name without quoting: lowercase ASCII letters,
/// digits and `_`, starting with a letter, at most 63 bytes.
fn plain_identifier(name: &str) -> bool {
    name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Makes `role` (created with `LOGIN` if missing, without a password: set one with
/// `ALTER ROLE`) the least-privileged user of the database behind `pool`: it alone (with the
/// owner and superusers) may connect, it may select, insert, update and delete in every table
/// of schema `public` (append only to [`APPEND_ONLY`], read only [`READ_ONLY`]) and use its
/// sequences, and it may create nothing. Run it as the database's owner after migrating;
/// running it again changes nothing.
pub async fn grant_service_role(pool: &PgPool, role: &str) -> Result<(), StoreError> {
    if !plain_identifier(role) {
        return Err(invalid(format!("invalid role name `{role}`")));
    }
    let mut tx = pool.begin().await.map_err(classify)?;
    let database: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(role)
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
    let mut statements = Vec::new();
    if !exists {
        statements.push(format!(
            "CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT"
        ));
    }
    statements.extend([
        format!("REVOKE ALL ON DATABASE \"{database}\" FROM PUBLIC"),
        format!("GRANT CONNECT ON DATABASE \"{database}\" TO {role}"),
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC".to_owned(),
        format!("GRANT USAGE ON SCHEMA public TO {role}"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"),
        format!("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}"),
        format!("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role}"),
    ]);
    let present: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' AND tablename = ANY($1)",
    )
    .bind(
        APPEND_ONLY
            .iter()
            .chain(READ_ONLY.iter())
            .map(|t| (*t).to_owned())
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(classify)?;
    for table in &present {
        let revoked = if READ_ONLY.contains(&table.as_str()) {
            "INSERT, UPDATE, DELETE, TRUNCATE"
        } else {
            "UPDATE, DELETE, TRUNCATE"
        };
        statements.push(format!("REVOKE {revoked} ON {table} FROM {role}"));
    }
    for statement in statements {
        sqlx::query(&statement)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    }
    tx.commit().await.map_err(classify)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_are_roles() {
        assert!(plain_identifier("km0_inventario"));
        assert!(plain_identifier("km0lp123_pagos"));
        for bad in [
            "",
            "Km0",
            "1km0",
            "km0-x",
            "km0;drop",
            "a\"b",
            &"a".repeat(64),
        ] {
            assert!(!plain_identifier(bad), "{bad}");
        }
    }
}
