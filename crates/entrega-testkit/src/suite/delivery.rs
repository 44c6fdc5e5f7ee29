//! The delivery contract every transport keeps, logs and queues alike, checked only through
//! [`Publisher`](entrega_core::Publisher), [`TopicAdmin`](entrega_core::TopicAdmin) and
//! [`Subscriber`](entrega_core::Subscriber): no committed offsets, end offsets or reads by
//! offset, which a queue (RabbitMQ) does not have. What a log adds (replay from an offset,
//! a silent member expelled by the broker) is in the log suite.
//!
//! Scenarios name each event by a `n` header and an `id_evento`, and poll until what they
//! need arrived or the harness's patience ran out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use entrega_core::{Headers, OutgoingMessage, Record, Subscription, TransportError};

use crate::harness::{BoxError, Scenario};
use crate::harness_delivery::{DeliveryFixture, DeliveryHarness};

/// `per_key` events for each of `keys` keys of `topic`, in rounds; header `n` numbers them
/// per key.
fn events(topic: &str, keys: usize, per_key: u32) -> Vec<OutgoingMessage> {
    (0..per_key)
        .flat_map(|n| (0..keys).map(move |k| (k, n)))
        .map(|(k, n)| OutgoingMessage {
            topic: topic.to_owned(),
            key: Some(format!("K-{k}")),
            headers: Headers::new()
                .with("tipo", "prueba.enviada")
                .with("id_evento", uuid::Uuid::new_v4().to_string())
                .with("n", n.to_string()),
            payload: format!("{{\"k\":{k},\"n\":{n}}}").into_bytes(),
        })
        .collect()
}

fn id(r: &Record) -> String {
    r.headers.get("id_evento").unwrap_or_default().to_owned()
}

/// Per key, the `n` headers in the order received.
fn by_key(records: &[Record]) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for r in records {
        let n = r
            .headers
            .get("n")
            .and_then(|n| n.parse().ok())
            .unwrap_or(u32::MAX);
        out.entry(r.key.clone().unwrap_or_default())
            .or_default()
            .push(n);
    }
    out
}

/// Next offsets to commit for everything in `records`.
fn next_offsets(records: &[Record]) -> Vec<(u32, i64)> {
    let mut next: BTreeMap<u32, i64> = BTreeMap::new();
    for r in records {
        let e = next.entry(r.partition).or_insert(0);
        *e = (*e).max(r.offset + 1);
    }
    next.into_iter().collect()
}

fn fail(message: String) -> Scenario {
    Err(BoxError::from(message))
}

/// Polls `members` in turn, committing what each gets when `commit`, until `want` distinct
/// events came or the harness's patience ran out; returns what each member got.
async fn share(
    fx: &dyn DeliveryFixture,
    members: &mut [&mut Box<dyn Subscription>],
    want: usize,
    commit: bool,
) -> Result<Vec<Vec<Record>>, BoxError> {
    let mut got: Vec<Vec<Record>> = members.iter().map(|_| Vec::new()).collect();
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + fx.patience();
    while seen.len() < want && Instant::now() < deadline {
        for (i, member) in members.iter_mut().enumerate() {
            let records = member.poll(100, fx.poll_wait()).await?;
            if records.is_empty() {
                continue;
            }
            if commit {
                commit_or_lost(member.as_mut(), &records).await?;
            }
            seen.extend(records.iter().map(id));
            got[i].extend(records);
        }
    }
    Ok(got)
}

/// Commits `records`; a partition taken away meanwhile is not an error (its records come
/// again to its new holder).
async fn commit_or_lost(sub: &mut dyn Subscription, records: &[Record]) -> Scenario {
    match sub.commit(&next_offsets(records)).await {
        Ok(()) | Err(TransportError::NotAssigned { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A topic that does not exist is refused as unknown, never silently dropped.
pub async fn unknown_topic_is_refused(h: &dyn DeliveryHarness) -> Scenario {
    let fx = h.fixture().await?;
    let result = fx
        .publisher()
        .publish(&events("no.such.topic.anywhere", 1, 1))
        .await;
    let outcome = match result {
        Err(TransportError::UnknownTopic { .. }) => Ok(()),
        other => fail(format!("expected UnknownTopic, got {other:?}")),
    };
    outcome.and(fx.teardown().await)
}

/// Key, headers and payload arrive as published.
pub async fn key_headers_and_payload_arrive_unchanged(h: &dyn DeliveryHarness) -> Scenario {
    let fx = h.fixture().await?;
    let result = async {
        let (group, topic) = fx.names("round-trip");
        let mut sub = fx.join(&group, &topic, "m1").await?;
        let mut headers = Headers::new()
            .with("tipo", "pedido.creado")
            .with("id_evento", uuid::Uuid::new_v4().to_string())
            .with(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            );
        headers.push("con espacio", "ñandú €");
        let sent = OutgoingMessage {
            topic: topic.clone(),
            key: Some("P-2026-000123".into()),
            headers: headers.clone(),
            payload: "{\"datos\":{\"queso\":\"curado\"}}".as_bytes().to_vec(),
        };
        fx.publisher().publish(std::slice::from_ref(&sent)).await?;
        let got = share(&*fx, &mut [&mut sub], 1, true).await?;
        let Some(r) = got[0].first() else {
            return fail("nothing arrived".into());
        };
        if r.key != sent.key || r.payload != sent.payload || r.topic != topic {
            return fail(format!("arrived changed: {r:?}"));
        }
        for (name, value) in headers.iter() {
            if r.headers.get(name) != Some(value) {
                return fail(format!(
                    "header `{name}` arrived as {:?}",
                    r.headers.get(name)
                ));
            }
        }
        sub.close().await?;
        fx.remove(&group, &topic).await
    }
    .await;
    result.and(fx.teardown().await)
}

/// One member gets every event once, each key's in publishing order.
pub async fn each_key_arrives_in_order(h: &dyn DeliveryHarness) -> Scenario {
    let fx = h.fixture().await?;
    let result = async {
        let (group, topic) = fx.names("order");
        let mut sub = fx.join(&group, &topic, "m1").await?;
        let sent = events(&topic, 12, 5);
        fx.publisher().publish(&sent).await?;
        let got = share(&*fx, &mut [&mut sub], sent.len(), true).await?;
        if got[0].len() != sent.len() {
            return fail(format!("{} of {} arrived", got[0].len(), sent.len()));
        }
        for (key, ns) in by_key(&got[0]) {
            if ns != vec![0, 1, 2, 3, 4] {
                return fail(format!("{key} arrived as {ns:?}"));
            }
        }
        sub.close().await?;
        fx.remove(&group, &topic).await
    }
    .await;
    result.and(fx.teardown().await)
}

/// Events a member received but never committed are delivered again, all of them, to the
/// next member; committed ones are not.
pub async fn uncommitted_come_again_and_committed_do_not(h: &dyn DeliveryHarness) -> Scenario {
    let fx = h.fixture().await?;
    let result = async {
        let (group, topic) = fx.names("redelivery");
        let mut first = fx.join(&group, &topic, "m1").await?;
        let committed = events(&topic, 4, 2);
        fx.publisher().publish(&committed).await?;
        share(&*fx, &mut [&mut first], committed.len(), true).await?;
        let uncommitted = events(&topic, 4, 2);
        fx.publisher().publish(&uncommitted).await?;
        let got = share(&*fx, &mut [&mut first], uncommitted.len(), false).await?;
        if got[0].len() != uncommitted.len() {
            return fail(format!("{} of {} arrived", got[0].len(), uncommitted.len()));
        }
        first.close().await?;
        let mut second = fx.join(&group, &topic, "m2").await?;
        let again = share(&*fx, &mut [&mut second], uncommitted.len(), true).await?;
        let want: BTreeSet<String> = uncommitted
            .iter()
            .filter_map(|m| m.headers.get("id_evento").map(str::to_owned))
            .collect();
        let came: BTreeSet<String> = again[0].iter().map(id).collect();
        if came != want {
            let old = committed
                .iter()
                .filter_map(|m| m.headers.get("id_evento"))
                .filter(|i| came.contains(*i))
                .count();
            return fail(format!(
                "{} of {} uncommitted came again, and {old} committed ones did",
                came.intersection(&want).count(),
                want.len()
            ));
        }
        second.close().await?;
        fx.remove(&group, &topic).await
    }
    .await;
    result.and(fx.teardown().await)
}

/// Two members of a group share its partitions: both get work, no partition is served by
/// both, every event arrives once (each poll committed), each key in order; once one
/// leaves, the other gets everything published after.
pub async fn members_share_partitions_and_a_leaver_hands_over(h: &dyn DeliveryHarness) -> Scenario {
    let fx = h.fixture().await?;
    let result = async {
        let (group, topic) = fx.names("members");
        let mut m1 = fx.join(&group, &topic, "m1").await?;
        let mut m2 = fx.join(&group, &topic, "m2").await?;
        // Let them hear of each other before anything is published.
        let settle = Instant::now() + fx.settle();
        while Instant::now() < settle {
            m1.poll(10, fx.poll_wait()).await?;
            m2.poll(10, fx.poll_wait()).await?;
        }
        let sent = events(&topic, 16, 3);
        fx.publisher().publish(&sent).await?;
        let got = share(&*fx, &mut [&mut m1, &mut m2], sent.len(), true).await?;
        let parts = |rs: &[Record]| rs.iter().map(|r| r.partition).collect::<BTreeSet<u32>>();
        if got[0].is_empty() || got[1].is_empty() {
            return fail(format!(
                "one member idle: {} / {}",
                got[0].len(),
                got[1].len()
            ));
        }
        if !parts(&got[0]).is_disjoint(&parts(&got[1])) {
            return fail("a partition was served by both members".into());
        }
        if got[0].len() + got[1].len() != sent.len() {
            return fail(format!(
                "{} deliveries for {} events",
                got[0].len() + got[1].len(),
                sent.len()
            ));
        }
        for records in &got {
            for (key, ns) in by_key(records) {
                if ns != vec![0, 1, 2] {
                    return fail(format!("{key} arrived as {ns:?}"));
                }
            }
        }
        m1.close().await?;
        let after = events(&topic, 16, 1);
        fx.publisher().publish(&after).await?;
        let got = share(&*fx, &mut [&mut m2], after.len(), true).await?;
        let ids: BTreeSet<String> = got[0].iter().map(id).collect();
        if ids.len() != after.len() {
            return fail(format!(
                "after the leave, {} of {} arrived at the one left",
                ids.len(),
                after.len()
            ));
        }
        m2.close().await?;
        fx.remove(&group, &topic).await
    }
    .await;
    result.and(fx.teardown().await)
}

/// A seek back serves the records from there again, in order; a pause holds back only its
/// partition.
pub async fn seek_serves_again_and_pause_holds_one_partition(h: &dyn DeliveryHarness) -> Scenario {
    let fx = h.fixture().await?;
    let result = async {
        let (group, topic) = fx.names("seek");
        let mut sub = fx.join(&group, &topic, "m1").await?;
        let sent = events(&topic, 12, 2);
        fx.publisher().publish(&sent).await?;
        let first = share(&*fx, &mut [&mut sub], sent.len(), false)
            .await?
            .remove(0);
        let Some(head) = first.first().cloned() else {
            return fail("nothing arrived".into());
        };
        let same: Vec<&Record> = first
            .iter()
            .filter(|r| r.partition == head.partition)
            .collect();
        sub.seek(head.partition, head.offset);
        sub.pause_for(head.partition, Duration::from_millis(600));
        let paused_at = Instant::now();
        // While paused, nothing of that partition comes.
        let during = sub.poll(100, Duration::from_millis(300)).await?;
        if during.iter().any(|r| r.partition == head.partition)
            && paused_at.elapsed() < Duration::from_millis(600)
        {
            return fail("a paused partition's records came".into());
        }
        // A poll slower than the pause (a loaded machine) may already bring them, rightly.
        let mut again: Vec<Record> = during
            .into_iter()
            .filter(|r| r.partition == head.partition)
            .collect();
        let deadline = Instant::now() + fx.patience();
        while again.len() < same.len() && Instant::now() < deadline {
            let records = sub.poll(100, fx.poll_wait()).await?;
            again.extend(
                records
                    .into_iter()
                    .filter(|r| r.partition == head.partition),
            );
        }
        let ids = |rs: &[&Record]| rs.iter().map(|r| id(r)).collect::<Vec<_>>();
        let again_refs: Vec<&Record> = again.iter().collect();
        if ids(&again_refs) != ids(&same) {
            return fail(format!(
                "after the seek, {} records came again of {}, or out of order",
                again.len(),
                same.len()
            ));
        }
        let mut all = first.clone();
        all.extend(again);
        commit_or_lost(sub.as_mut(), &all).await?;
        sub.close().await?;
        fx.remove(&group, &topic).await
    }
    .await;
    result.and(fx.teardown().await)
}
