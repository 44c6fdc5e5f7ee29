//! Log conformance, consuming side: committed offsets, redelivery, partition sharing,
//! takeover after a silent member, fencing, seek and pause.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use entrega_core::{Subscription, TransportError};
use tokio::time::Instant;

use super::log_support::{
    collect, key_for, message, next_offsets, run, settle, step, Pace, POLL_WAIT,
};
use crate::ensure;
use crate::harness::{BoxError, LogFixture, LogHarness, Scenario};

const GROUP: &str = "inventario";

async fn publish_to(
    fx: &dyn LogFixture,
    topic: &str,
    partition: u32,
    partitions: u32,
    n: usize,
) -> Scenario {
    let key = key_for(partition, partitions, "clave");
    let batch: Vec<_> = (0..n)
        .map(|i| message(topic, Some(&key), &format!("p{partition}-{i}")))
        .collect();
    fx.publisher().publish(&batch).await?;
    Ok(())
}

/// Polls both members until their assignments are disjoint, non-empty and cover `partitions`.
async fn converge(
    a: &mut Box<dyn Subscription>,
    b: &mut Box<dyn Subscription>,
    clock: &Pace,
    partitions: u32,
) -> Result<(), BoxError> {
    for _ in 0..100 {
        step(a, clock).await?;
        step(b, clock).await?;
        let (sa, sb): (BTreeSet<u32>, BTreeSet<u32>) = (
            a.assignment().into_iter().collect(),
            b.assignment().into_iter().collect(),
        );
        ensure!(
            sa.is_disjoint(&sb),
            "members share partitions: {sa:?} / {sb:?}"
        );
        if !sa.is_empty() && !sb.is_empty() && sa.len() + sb.len() == partitions as usize {
            return Ok(());
        }
    }
    Err("two members did not split the partitions within 100 rounds".into())
}

/// A member that commits and closes is resumed from its committed offset.
pub async fn resume_from_committed_offset(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            fx.admin().ensure_topic("reanudar", 1).await?;
            publish_to(fx, "reanudar", 0, 1, 10).await?;
            let mut a = fx.subscriber().subscribe(GROUP, "reanudar", "a").await?;
            let got = collect(&mut a, &clock, 10, 50).await?;
            let offsets: Vec<i64> = got.iter().map(|r| r.offset).collect();
            ensure!(
                offsets == (0..10).collect::<Vec<_>>(),
                "first read {offsets:?}"
            );
            a.commit(&[(0, 5)]).await?;
            a.close().await?;
            ensure!(
                fx.committed(GROUP, "reanudar").await? == vec![(0, 5)],
                "committed offset"
            );
            let mut again = fx.subscriber().subscribe(GROUP, "reanudar", "a").await?;
            let got = collect(&mut again, &clock, 5, 50).await?;
            let offsets: Vec<i64> = got.iter().map(|r| r.offset).collect();
            ensure!(
                offsets == (5..10).collect::<Vec<_>>(),
                "resumed read {offsets:?}"
            );
            again.close().await?;
            Ok(())
        })
    })
    .await
}

/// Records read but not committed are delivered again to the next member (at-least-once).
pub async fn uncommitted_records_are_redelivered(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            fx.admin().ensure_topic("reentrega", 1).await?;
            publish_to(fx, "reentrega", 0, 1, 5).await?;
            let mut a = fx.subscriber().subscribe(GROUP, "reentrega", "a").await?;
            ensure!(
                collect(&mut a, &clock, 5, 50).await?.len() == 5,
                "a read everything"
            );
            a.close().await?;
            let mut b = fx.subscriber().subscribe(GROUP, "reentrega", "b").await?;
            let got = collect(&mut b, &clock, 5, 50).await?;
            let offsets: Vec<i64> = got.iter().map(|r| r.offset).collect();
            ensure!(
                offsets == (0..5).collect::<Vec<_>>(),
                "redelivered {offsets:?}"
            );
            b.close().await?;
            Ok(())
        })
    })
    .await
}

/// Two members split the partitions and, committing as they go, see every record once.
pub async fn two_members_split_partitions(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let (topic, partitions) = ("reparto", 4);
            fx.admin().ensure_topic(topic, partitions).await?;
            let mut a = fx.subscriber().subscribe(GROUP, topic, "a").await?;
            let mut b = fx.subscriber().subscribe(GROUP, topic, "b").await?;
            converge(&mut a, &mut b, &clock, partitions).await?;
            let batch: Vec<_> = (0..40)
                .map(|i| message(topic, Some(&format!("k{i}")), &i.to_string()))
                .collect();
            fx.publisher().publish(&batch).await?;
            let mut seen: BTreeMap<(u32, i64), usize> = BTreeMap::new();
            let mut per_member = [0usize; 2];
            for _ in 0..200 {
                for (i, sub) in [&mut a, &mut b].into_iter().enumerate() {
                    let got = step(sub, &clock).await?;
                    per_member[i] += got.len();
                    for r in &got {
                        *seen.entry((r.partition, r.offset)).or_default() += 1;
                    }
                    let offsets = next_offsets(&got);
                    if !offsets.is_empty() {
                        sub.commit(&offsets).await?;
                    }
                }
                if seen.len() == 40 {
                    break;
                }
            }
            ensure!(seen.len() == 40, "{} of 40 records seen", seen.len());
            ensure!(
                seen.values().all(|n| *n == 1),
                "records seen twice: {seen:?}"
            );
            ensure!(
                per_member.iter().all(|n| *n > 0),
                "one member got nothing: {per_member:?}"
            );
            let committed = fx.committed(GROUP, topic).await?;
            let ends: Vec<_> = fx
                .end_offsets(topic)
                .await?
                .into_iter()
                .filter(|(_, end)| *end > 0)
                .collect();
            ensure!(
                committed == ends,
                "committed {committed:?} vs end offsets {ends:?}"
            );
            Ok(())
        })
    })
    .await
}

/// A member that stops heartbeating loses its partitions after the ttl; the survivor resumes
/// them from the last committed offset.
pub async fn silent_member_loses_partitions(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let (topic, partitions) = ("relevo", 2);
            fx.admin().ensure_topic(topic, partitions).await?;
            let mut a = fx.subscriber().subscribe(GROUP, topic, "a").await?;
            let mut b = fx.subscriber().subscribe(GROUP, topic, "b").await?;
            converge(&mut a, &mut b, &clock, partitions).await?;
            let lost = a.assignment();
            for p in 0..partitions {
                publish_to(fx, topic, p, partitions, 10).await?;
            }
            let got = collect(&mut a, &clock, 10 * lost.len(), 50).await?;
            ensure!(got.len() == 10 * lost.len(), "a read {} records", got.len());
            let half: Vec<(u32, i64)> = lost.iter().map(|p| (*p, 4)).collect();
            a.commit(&half).await?;
            // `a` now goes silent: no poll, no close, as if its process froze.
            let mut first_seen: BTreeMap<u32, i64> = BTreeMap::new();
            let mut last_seen: BTreeMap<u32, i64> = BTreeMap::new();
            for _ in 0..100 {
                clock.advance(1_000);
                for r in b.poll(100, clock.poll_wait()).await? {
                    first_seen.entry(r.partition).or_insert(r.offset);
                    last_seen.insert(r.partition, r.offset);
                }
                if lost.iter().all(|p| last_seen.get(p) == Some(&9)) {
                    break;
                }
            }
            ensure!(
                b.assignment().len() == partitions as usize,
                "survivor holds {:?}",
                b.assignment()
            );
            for p in &lost {
                ensure!(
                    first_seen.get(p) == Some(&4),
                    "partition {p} resumed at {:?}, not 4",
                    first_seen.get(p)
                );
                ensure!(
                    last_seen.get(p) == Some(&9),
                    "partition {p} not read to the end"
                );
            }
            b.commit(&lost.iter().map(|p| (*p, 10)).collect::<Vec<_>>())
                .await?;
            Ok(())
        })
    })
    .await
}

/// A commit from a member whose partition was taken over is refused and writes nothing.
pub async fn stale_commit_is_refused(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            fx.admin().ensure_topic("vallado", 1).await?;
            publish_to(fx, "vallado", 0, 1, 4).await?;
            let mut a = fx.subscriber().subscribe(GROUP, "vallado", "a").await?;
            ensure!(
                collect(&mut a, &clock, 4, 50).await?.len() == 4,
                "a read everything"
            );
            a.commit(&[(0, 2)]).await?;
            clock.advance(11_000);
            let mut b = fx.subscriber().subscribe(GROUP, "vallado", "b").await?;
            let got = collect(&mut b, &clock, 2, 50).await?;
            ensure!(
                b.assignment() == vec![0],
                "b did not take the partition over"
            );
            ensure!(
                got.first().map(|r| r.offset) == Some(2),
                "b resumed at {:?}",
                got.first().map(|r| r.offset)
            );
            let res = a.commit(&[(0, 4)]).await;
            ensure!(
                matches!(res, Err(TransportError::NotAssigned { partition: 0, .. })),
                "stale commit gave {res:?}"
            );
            ensure!(
                fx.committed(GROUP, "vallado").await? == vec![(0, 2)],
                "stale commit wrote"
            );
            b.commit(&[(0, 4)]).await?;
            ensure!(
                fx.committed(GROUP, "vallado").await? == vec![(0, 4)],
                "owner commit"
            );
            Ok(())
        })
    })
    .await
}

/// Seeking back delivers the records again, in order.
pub async fn seek_redelivers(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            fx.admin().ensure_topic("rebobinar", 1).await?;
            publish_to(fx, "rebobinar", 0, 1, 5).await?;
            let mut a = fx.subscriber().subscribe(GROUP, "rebobinar", "a").await?;
            ensure!(
                collect(&mut a, &clock, 5, 50).await?.len() == 5,
                "a read everything"
            );
            a.seek(0, 1);
            let got = collect(&mut a, &clock, 4, 50).await?;
            let offsets: Vec<i64> = got.iter().map(|r| r.offset).collect();
            ensure!(offsets == vec![1, 2, 3, 4], "after seek {offsets:?}");
            Ok(())
        })
    })
    .await
}

/// A paused partition is held back while the others flow, and flows again afterwards.
pub async fn pause_holds_one_partition(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            let (topic, partitions) = ("pausa", 2);
            fx.admin().ensure_topic(topic, partitions).await?;
            let mut a = fx.subscriber().subscribe(GROUP, topic, "a").await?;
            settle(&mut a, &clock, 2).await?;
            ensure!(
                a.assignment() == vec![0, 1],
                "a lone member holds {:?}",
                a.assignment()
            );
            let pause = Duration::from_secs(3);
            let started = Instant::now();
            a.pause_for(0, pause);
            publish_to(fx, topic, 0, partitions, 3).await?;
            publish_to(fx, topic, 1, partitions, 3).await?;
            let mut flowing = Vec::new();
            while flowing.len() < 3 && started.elapsed() < pause {
                // The clock stays put: a pause measured on it must not end here.
                flowing.extend(a.poll(100, POLL_WAIT).await?);
            }
            ensure!(started.elapsed() < pause, "too slow to observe the pause");
            ensure!(
                flowing.len() == 3,
                "{} records of the running partition",
                flowing.len()
            );
            ensure!(
                flowing.iter().all(|r| r.partition == 1),
                "the paused partition delivered"
            );
            let mut resumed = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(15);
            while resumed.len() < 3 && Instant::now() < deadline {
                clock.advance(500);
                resumed.extend(a.poll(100, Duration::from_millis(100)).await?);
            }
            ensure!(
                resumed.len() == 3 && resumed.iter().all(|r| r.partition == 0),
                "after the pause: {resumed:?}"
            );
            Ok(())
        })
    })
    .await
}

/// A member that subscribes again under its name (a restarted process) takes its partition
/// back at once, a tenth into the earlier subscription's lease, and resumes from the committed
/// offset; the earlier subscription's commit is refused and writes nothing. Skipped where
/// partitions are not leased by name (Kafka).
pub async fn restarted_member_takes_its_partitions_back_at_once(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, clock| {
        Box::pin(async move {
            if !clock.leases_by_name() {
                return Ok(());
            }
            fx.admin().ensure_topic("reinicio", 1).await?;
            publish_to(fx, "reinicio", 0, 1, 4).await?;
            let mut first = fx.subscriber().subscribe(GROUP, "reinicio", "a").await?;
            ensure!(
                collect(&mut first, &clock, 4, 5).await?.len() == 4,
                "the first life read everything"
            );
            first.commit(&[(0, 2)]).await?;
            // The restart: no close, well within the lease (10 s).
            clock.advance(1_000);
            let mut again = fx.subscriber().subscribe(GROUP, "reinicio", "a").await?;
            let got = step(&mut again, &clock).await?;
            ensure!(
                again.assignment() == vec![0],
                "the later life holds {:?} on its first poll",
                again.assignment()
            );
            ensure!(
                got.iter().map(|r| r.offset).collect::<Vec<_>>() == vec![2, 3],
                "the later life read {:?}",
                got.iter().map(|r| r.offset).collect::<Vec<_>>()
            );
            let res = first.commit(&[(0, 4)]).await;
            ensure!(
                matches!(res, Err(TransportError::NotAssigned { partition: 0, .. })),
                "the earlier life's commit gave {res:?}"
            );
            ensure!(
                fx.committed(GROUP, "reinicio").await? == vec![(0, 2)],
                "the earlier life's commit wrote"
            );
            again.commit(&[(0, 4)]).await?;
            ensure!(
                fx.committed(GROUP, "reinicio").await? == vec![(0, 4)],
                "the later life's commit"
            );
            Ok(())
        })
    })
    .await
}
