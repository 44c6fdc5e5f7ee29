//! Inbox (idempotent consumer) conformance: a key is new once per consumer, only committed
//! claims count, and old keys can be purged.

use std::time::Duration;

use crate::ensure;
use crate::harness::{InboxFixture, InboxHarness, Scenario, TxEnd};

async fn run<F>(h: &dyn InboxHarness, body: F) -> Scenario
where
    F: for<'a> FnOnce(
        &'a dyn InboxFixture,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = Scenario> + Send + 'a>>,
{
    let fx = h.inbox().await?;
    let result = body(fx.as_ref()).await;
    let teardown = fx.teardown().await;
    result.and(teardown)
}

/// The first claim of a key is new, the second a duplicate.
pub async fn claim_new_then_duplicate(h: &dyn InboxHarness) -> Scenario {
    run(h, |fx| {
        Box::pin(async move {
            let id = uuid::Uuid::new_v4().to_string();
            ensure!(
                fx.claim("inventario", &id, TxEnd::Commit).await?,
                "first claim is not new"
            );
            ensure!(
                !fx.claim("inventario", &id, TxEnd::Commit).await?,
                "second claim is not a duplicate"
            );
            ensure!(fx.count("inventario").await? == 1, "one key expected");
            Ok(())
        })
    })
    .await
}

/// The same message id is new for each consumer.
pub async fn same_id_for_two_consumers(h: &dyn InboxHarness) -> Scenario {
    run(h, |fx| {
        Box::pin(async move {
            let id = uuid::Uuid::new_v4().to_string();
            ensure!(
                fx.claim("inventario", &id, TxEnd::Commit).await?,
                "new for inventario"
            );
            ensure!(
                fx.claim("analitica", &id, TxEnd::Commit).await?,
                "new for analitica too"
            );
            ensure!(fx.count("inventario").await? == 1, "inventario keys");
            ensure!(fx.count("analitica").await? == 1, "analitica keys");
            Ok(())
        })
    })
    .await
}

/// A claim whose transaction rolls back leaves nothing: the message is new again.
pub async fn rolled_back_claim_leaves_nothing(h: &dyn InboxHarness) -> Scenario {
    run(h, |fx| {
        Box::pin(async move {
            let id = uuid::Uuid::new_v4().to_string();
            ensure!(
                fx.claim("inventario", &id, TxEnd::Rollback).await?,
                "claim inside the tx is new"
            );
            ensure!(
                fx.count("inventario").await? == 0,
                "rolled-back key was kept"
            );
            ensure!(
                fx.claim("inventario", &id, TxEnd::Commit).await?,
                "not new after the rollback"
            );
            Ok(())
        })
    })
    .await
}

/// Purging removes keys older than the age and keeps newer ones.
pub async fn purge_by_age(h: &dyn InboxHarness) -> Scenario {
    run(h, |fx| {
        Box::pin(async move {
            let (old, fresh) = ("old-message", "fresh-message");
            fx.claim("inventario", old, TxEnd::Commit).await?;
            fx.claim("inventario", fresh, TxEnd::Commit).await?;
            fx.backdate("inventario", old, Duration::from_secs(2 * 3600))
                .await?;
            let purged = fx.purge_older_than(Duration::from_secs(3600)).await?;
            ensure!(purged == 1, "purged {purged} keys, expected 1");
            ensure!(fx.count("inventario").await? == 1, "one key must remain");
            ensure!(
                fx.claim("inventario", old, TxEnd::Commit).await?,
                "purged key is not new again"
            );
            ensure!(
                !fx.claim("inventario", fresh, TxEnd::Commit).await?,
                "fresh key was purged"
            );
            Ok(())
        })
    })
    .await
}
