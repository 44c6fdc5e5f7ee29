//! Consuming from a real RabbitMQ (`ENTREGA_TEST_AMQP`): each shard's deliveries in order,
//! acked only at commit, delivered again when a member leaves without committing, served again
//! after a seek without the broker, shards shared between members, and a cancelled consumer
//! subscribed again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use entrega_amqp::{Amqp, AmqpConfig};
use entrega_core::{Headers, OutgoingMessage, Record, Subscription};
use lapin::options::{BasicGetOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};

const SHARDS: u32 = 3;

fn url() -> String {
    std::env::var("ENTREGA_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

fn amqp() -> Amqp {
    Amqp::connect(AmqpConfig::from_url(&format!("{}?shards={SHARDS}&prefetch=50", url())).unwrap())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}.{}", uuid::Uuid::new_v4().simple())
}

/// `per_key` messages for each of `keys` keys, in rounds; header `n` numbers them per key.
fn batch(topic: &str, keys: usize, per_key: u32) -> Vec<OutgoingMessage> {
    (0..per_key)
        .flat_map(|n| (0..keys).map(move |k| (k, n)))
        .map(|(k, n)| OutgoingMessage {
            topic: topic.to_owned(),
            key: Some(format!("P-{k}")),
            headers: Headers::new()
                .with("id_evento", uuid::Uuid::new_v4().to_string())
                .with("n", n.to_string()),
            payload: b"{}".to_vec(),
        })
        .collect()
}

/// Polls until `want` records came or 20 s passed.
async fn take(sub: &mut dyn Subscription, want: usize) -> Vec<Record> {
    let mut got = Vec::new();
    for _ in 0..100 {
        if got.len() >= want {
            break;
        }
        got.extend(sub.poll(100, Duration::from_millis(200)).await.unwrap());
    }
    got
}

/// Per key, the `n` headers in the order received.
fn by_key(records: &[Record]) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for r in records {
        out.entry(r.key.clone().unwrap())
            .or_default()
            .push(r.headers.get("n").unwrap().parse().unwrap());
    }
    out
}

/// Next offsets to commit for everything in `records`.
fn next_offsets(records: &[Record]) -> Vec<(u32, i64)> {
    let mut next: HashMap<u32, i64> = HashMap::new();
    for r in records {
        let e = next.entry(r.partition).or_insert(0);
        *e = (*e).max(r.offset + 1);
    }
    next.into_iter().collect()
}

async fn cleanup(group: &str, topic: &str) {
    amqp().delete_group(group, topic).await.unwrap();
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let _ = channel
        .exchange_delete(topic.into(), ExchangeDeleteOptions::default())
        .await;
}

#[tokio::test]
async fn every_key_in_order_acked_at_commit_and_delivered_again_when_left_uncommitted() {
    let amqp = amqp();
    let (group, topic) = (unique("g"), unique("t"));
    let mut first = amqp
        .subscriber()
        .subscribe(&group, &topic, "m1")
        .await
        .unwrap();
    let sent = batch(&topic, 12, 5);
    amqp.publisher().publish(&sent).await.unwrap();

    let got = take(first.as_mut(), sent.len()).await;
    assert_eq!(got.len(), sent.len());
    // Every confirmed message arrived once, headers and payload intact.
    let mut ids: Vec<&str> = got
        .iter()
        .map(|r| r.headers.get("id_evento").unwrap())
        .collect();
    let mut want: Vec<&str> = sent
        .iter()
        .map(|m| m.headers.get("id_evento").unwrap())
        .collect();
    ids.sort_unstable();
    want.sort_unstable();
    assert_eq!(ids, want);
    assert!(got.iter().all(|r| r.payload == b"{}" && r.topic == topic));
    let keys = by_key(&got);
    assert_eq!(keys.len(), 12);
    for (key, ns) in &keys {
        assert_eq!(ns, &(0..5).collect::<Vec<u32>>(), "{key} out of order");
    }
    // One key, one shard.
    let mut shard_of: HashMap<String, u32> = HashMap::new();
    for r in &got {
        let s = *shard_of
            .entry(r.key.clone().unwrap())
            .or_insert(r.partition);
        assert_eq!(s, r.partition);
    }

    // Commit the first half of each shard only, then leave.
    let mut half: Vec<(u32, i64)> = next_offsets(&got);
    for (_, next) in &mut half {
        *next /= 2;
    }
    let kept: usize = half.iter().map(|(_, n)| usize::try_from(*n).unwrap()).sum();
    first.commit(&half).await.unwrap();
    first.close().await.unwrap();

    // The uncommitted rest comes again, to the next member; the committed part does not.
    let mut second = amqp
        .subscriber()
        .subscribe(&group, &topic, "m2")
        .await
        .unwrap();
    let again = take(second.as_mut(), sent.len() - kept).await;
    assert_eq!(again.len(), sent.len() - kept);
    let extra = second.poll(100, Duration::from_millis(500)).await.unwrap();
    assert!(
        extra.is_empty(),
        "acked deliveries came back: {}",
        extra.len()
    );
    for ns in by_key(&again).values() {
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "redelivered out of order: {ns:?}"
        );
    }
    second.commit(&next_offsets(&again)).await.unwrap();
    second.close().await.unwrap();
    cleanup(&group, &topic).await;
}

#[tokio::test]
async fn a_seek_serves_held_deliveries_again_and_a_pause_holds_the_shard() {
    let amqp = amqp();
    let (group, topic) = (unique("g"), unique("t"));
    let mut sub = amqp
        .subscriber()
        .subscribe(&group, &topic, "m1")
        .await
        .unwrap();
    let sent = batch(&topic, 1, 4);
    amqp.publisher().publish(&sent).await.unwrap();
    let got = take(sub.as_mut(), 4).await;
    assert_eq!(by_key(&got)["P-0"], vec![0, 1, 2, 3]);
    let partition = got[0].partition;
    assert_eq!(sub.assignment(), vec![partition]);

    // Offset 2 failed: back to it, paused a moment; then 2 and 3 again, in order.
    sub.seek(partition, got[2].offset);
    sub.pause_for(partition, Duration::from_millis(300));
    assert!(
        sub.poll(10, Duration::from_millis(50))
            .await
            .unwrap()
            .is_empty(),
        "paused"
    );
    let again = take(sub.as_mut(), 2).await;
    assert_eq!(by_key(&again)["P-0"], vec![2, 3]);
    assert_eq!(again[0].offset, got[2].offset);
    sub.commit(&next_offsets(&again)).await.unwrap();
    sub.close().await.unwrap();
    cleanup(&group, &topic).await;
}

/// Polls every member in turn, committing what each gets, until `want` distinct events came
/// or 30 s passed; returns what each member got.
async fn share(members: &mut [&mut dyn Subscription], want: usize) -> Vec<Vec<Record>> {
    let mut got: Vec<Vec<Record>> = members.iter().map(|_| Vec::new()).collect();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..150 {
        if seen.len() >= want {
            break;
        }
        for (i, member) in members.iter_mut().enumerate() {
            let records = member.poll(100, Duration::from_millis(100)).await.unwrap();
            if records.is_empty() {
                continue;
            }
            member.commit(&next_offsets(&records)).await.unwrap();
            for r in &records {
                seen.insert(r.headers.get("id_evento").unwrap().to_owned());
            }
            got[i].extend(records);
        }
    }
    got
}

#[tokio::test]
async fn members_share_the_shards_and_one_that_leaves_hands_its_share_over() {
    let amqp = amqp();
    let (group, topic) = (unique("g"), unique("t"));
    let mut m1 = amqp
        .subscriber()
        .subscribe(&group, &topic, "m1")
        .await
        .unwrap();
    let mut m2 = amqp
        .subscriber()
        .subscribe(&group, &topic, "m2")
        .await
        .unwrap();
    // Let them hear each other.
    for _ in 0..15 {
        m1.poll(10, Duration::from_millis(100)).await.unwrap();
        m2.poll(10, Duration::from_millis(100)).await.unwrap();
    }
    let first = batch(&topic, 12, 3);
    amqp.publisher().publish(&first).await.unwrap();
    let got = share(&mut [m1.as_mut(), m2.as_mut()], first.len()).await;
    let shards = |records: &[Record]| -> std::collections::BTreeSet<u32> {
        records.iter().map(|r| r.partition).collect()
    };
    assert!(
        !got[0].is_empty() && !got[1].is_empty(),
        "both members work: {} / {}",
        got[0].len(),
        got[1].len()
    );
    assert!(
        shards(&got[0]).is_disjoint(&shards(&got[1])),
        "a shard served by two members"
    );
    assert_eq!(
        got[0].len() + got[1].len(),
        first.len(),
        "each event served once"
    );
    for records in &got {
        for (key, ns) in by_key(records) {
            assert_eq!(ns, vec![0, 1, 2], "{key}");
        }
    }

    // m1 leaves: m2 takes every shard and gets all that comes next.
    m1.close().await.unwrap();
    let second = batch(&topic, 12, 2);
    amqp.publisher().publish(&second).await.unwrap();
    let got = share(&mut [m2.as_mut()], second.len()).await;
    let ids: std::collections::HashSet<&str> = got[0]
        .iter()
        .map(|r| r.headers.get("id_evento").unwrap())
        .collect();
    assert_eq!(ids.len(), second.len());
    assert_eq!(shards(&got[0]).len(), usize::try_from(SHARDS).unwrap());
    m2.close().await.unwrap();
    cleanup(&group, &topic).await;
}

#[tokio::test]
async fn a_consumer_the_broker_cancels_subscribes_again_and_nothing_is_lost() {
    let amqp = amqp();
    let (group, topic) = (unique("g"), unique("t"));
    let mut sub = amqp
        .subscriber()
        .subscribe(&group, &topic, "m1")
        .await
        .unwrap();
    let first = batch(&topic, 6, 1);
    amqp.publisher().publish(&first).await.unwrap();
    let got = take(sub.as_mut(), first.len()).await;
    assert_eq!(got.len(), first.len());
    sub.commit(&next_offsets(&got)).await.unwrap();

    // Delete one shard queue under the member: the broker cancels its consumer.
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let victim = got[0].partition;
    let q = amqp.group_queues(&group, &topic).queue(victim);
    channel
        .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();

    // The member notices, declares the group again and consumes every shard: messages
    // published after the queue is back all arrive, on every shard.
    let mut got_again = Vec::new();
    let mut sent_again = Vec::new();
    for round in 0..20u32 {
        let _ = sub.poll(100, Duration::from_millis(200)).await.unwrap();
        if sub.assignment().len() == usize::try_from(SHARDS).unwrap() || round > 5 {
            let more = batch(&topic, 6, 1);
            if amqp.publisher().publish(&more).await.is_ok() {
                sent_again = more;
                break;
            }
        }
    }
    assert!(
        !sent_again.is_empty(),
        "publishing never found the group's queues again"
    );
    got_again.extend(take(sub.as_mut(), sent_again.len()).await);
    assert_eq!(got_again.len(), sent_again.len());
    // The queue is back in the ring and consumed: each key lands on its shard as before,
    // the victim's keys included.
    let shard_before: HashMap<String, u32> = got
        .iter()
        .map(|r| (r.key.clone().unwrap(), r.partition))
        .collect();
    for r in &got_again {
        assert_eq!(
            Some(&r.partition),
            shard_before.get(r.key.as_ref().unwrap())
        );
    }
    assert!(got_again.iter().any(|r| r.partition == victim));
    sub.commit(&next_offsets(&got_again)).await.unwrap();
    sub.close().await.unwrap();
    cleanup(&group, &topic).await;
}

#[tokio::test]
async fn a_message_past_the_delivery_limit_lands_in_the_groups_dead_letter_queue() {
    let amqp = Amqp::connect(
        AmqpConfig::from_url(&format!("{}?shards={SHARDS}&delivery_limit=2", url())).unwrap(),
    );
    let (group, topic) = (unique("g"), unique("t"));
    let mut probe = amqp
        .subscriber()
        .subscribe(&group, &topic, "probe")
        .await
        .unwrap();
    probe.close().await.unwrap();
    let sent = batch(&topic, 1, 1);
    amqp.publisher().publish(&sent).await.unwrap();
    // Members that take it and die without committing, until the queue gives up on it.
    let mut deliveries = 0;
    for round in 0..6 {
        let mut member = amqp
            .subscriber()
            .subscribe(&group, &topic, &format!("m{round}"))
            .await
            .unwrap();
        let got = take(member.as_mut(), 1).await;
        member.close().await.unwrap();
        if got.is_empty() {
            break;
        }
        deliveries += 1;
    }
    assert_eq!(
        deliveries, 3,
        "delivered once plus the two redeliveries the limit allows"
    );
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let dlq = amqp.group_queues(&group, &topic).dead_letter_queue();
    let mut dead = None;
    for _ in 0..50 {
        dead = channel
            .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        if dead.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dead = dead.expect("the message is in the dead-letter queue, not dropped");
    let headers = entrega_amqp::delivery_headers(&dead.delivery.properties);
    assert_eq!(headers.get("id_evento"), sent[0].headers.get("id_evento"));
    cleanup(&group, &topic).await;
}
