//! Parking conformance (ordered retries): records park once, a key's head is its lowest
//! offset, keys and subscriptions stay apart, and attempts survive a second park.

use std::sync::Arc;

use entrega_core::{Headers, ParkedAt, ParkedRecord, ParkingStore};

use crate::ensure;
use crate::harness::{ParkingFixture, ParkingHarness, Scenario};

async fn run<F>(h: &dyn ParkingHarness, body: F) -> Scenario
where
    F: FnOnce(
        Arc<dyn ParkingStore>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Scenario> + Send>>,
{
    let fx: Box<dyn ParkingFixture> = h.parking().await?;
    let result = body(fx.store()).await;
    let teardown = fx.teardown().await;
    result.and(teardown)
}

/// A parked record of group `g`, topic `t`.
fn record(partition: u32, offset: i64, key: Option<&str>, attempts: u32) -> ParkedRecord {
    ParkedRecord {
        group: "g".into(),
        topic: "t".into(),
        partition,
        offset,
        key: key.map(str::to_owned),
        headers: Headers::new().with("tipo", "pedido.creado"),
        payload: format!("{{\"offset\":{offset}}}").into_bytes(),
        attempts,
        not_before_ms: 1_000 + offset,
        last_error: (attempts > 0).then(|| "boom".to_owned()),
        parked_at_ms: 500,
    }
}

const AT: ParkedAt<'static> = ParkedAt {
    group: "g",
    topic: "t",
    partition: 0,
};

/// A key's head is its lowest offset; removing it exposes the next; every field round-trips.
pub async fn head_is_lowest_offset_of_the_key(h: &dyn ParkingHarness) -> Scenario {
    run(h, |store| {
        Box::pin(async move {
            let parked = vec![
                record(0, 7, Some("k"), 0),
                record(0, 3, Some("k"), 2),
                record(0, 5, Some("other"), 1),
                record(0, 9, Some("k"), 0),
            ];
            store.park(&parked).await?;
            let head = store.head(AT, Some("k")).await?;
            ensure!(
                head.as_ref() == parked.get(1),
                "head of k: {head:?}, expected offset 3 with every field as parked"
            );
            store.remove(AT, 3).await?;
            let head = store.head(AT, Some("k")).await?.map(|r| r.offset);
            ensure!(head == Some(7), "after removing 3 the head is {head:?}");
            let other = store.head(AT, Some("other")).await?.map(|r| r.offset);
            ensure!(other == Some(5), "other key's head: {other:?}");
            store.remove(AT, 7).await?;
            store.remove(AT, 9).await?;
            ensure!(
                store.head(AT, Some("k")).await?.is_none(),
                "k still has a head after every record was removed"
            );
            Ok(())
        })
    })
    .await
}

/// Parking a record again keeps the first copy and its attempts (a redelivery after a crash).
pub async fn parking_again_keeps_the_first_copy(h: &dyn ParkingHarness) -> Scenario {
    run(h, |store| {
        Box::pin(async move {
            store.park(&[record(0, 4, Some("k"), 0)]).await?;
            store.reschedule(AT, 4, 3, 9_999, "third failure").await?;
            store.park(&[record(0, 4, Some("k"), 1)]).await?;
            let head = store.head(AT, Some("k")).await?;
            ensure!(
                head.as_ref().map(|r| (r.attempts, r.not_before_ms)) == Some((3, 9_999)),
                "second park overwrote the first: {head:?}"
            );
            ensure!(
                head.and_then(|r| r.last_error).as_deref() == Some("third failure"),
                "last error not kept"
            );
            let all = store.list("g", "t", 10).await?;
            ensure!(all.len() == 1, "{} rows for one record", all.len());
            Ok(())
        })
    })
    .await
}

/// Keys, partitions, topics and groups are separate; records without a key form one key.
pub async fn keys_and_subscriptions_stay_apart(h: &dyn ParkingHarness) -> Scenario {
    run(h, |store| {
        Box::pin(async move {
            let mut other_group = record(0, 1, Some("k"), 1);
            other_group.group = "h".into();
            let mut other_topic = record(0, 2, Some("k"), 1);
            other_topic.topic = "u".into();
            store
                .park(&[
                    record(0, 5, None, 1),
                    record(0, 6, Some("k"), 0),
                    record(0, 8, None, 0),
                    record(1, 4, Some("z"), 1),
                    other_group,
                    other_topic,
                ])
                .await?;
            let mut keys = store.parked_keys(AT).await?;
            keys.sort();
            ensure!(
                keys == vec![None, Some("k".to_owned())],
                "keys of partition 0: {keys:?}"
            );
            let keyless = store.head(AT, None).await?.map(|r| r.offset);
            ensure!(
                keyless == Some(5),
                "head of the keyless records: {keyless:?}"
            );
            let k = store.head(AT, Some("k")).await?.map(|r| r.offset);
            ensure!(
                k == Some(6),
                "head of k in g/t/0: {k:?} (other group or topic leaked)"
            );
            let p1 = ParkedAt { partition: 1, ..AT };
            let z = store.head(p1, Some("z")).await?.map(|r| r.offset);
            ensure!(z == Some(4), "partition 1: {z:?}");
            ensure!(
                store.head(AT, Some("z")).await?.is_none(),
                "partition 1's key seen in partition 0"
            );
            let listed: Vec<(u32, i64)> = store
                .list("g", "t", 10)
                .await?
                .iter()
                .map(|r| (r.partition, r.offset))
                .collect();
            ensure!(
                listed == vec![(0, 5), (0, 6), (0, 8), (1, 4)],
                "list of g/t in partition and offset order: {listed:?}"
            );
            let limited = store.list("g", "t", 2).await?.len();
            ensure!(limited == 2, "list ignored its limit: {limited}");
            Ok(())
        })
    })
    .await
}
