//! Log conformance, publishing side: topics, placement, order, headers, concurrent appends.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use entrega_core::{partition_for, Headers, OutgoingMessage, TransportError};

use super::log_support::{message, read_all, run, text};
use crate::ensure;
use crate::harness::{LogHarness, Scenario};

/// Creating a topic twice keeps the first partition count.
pub async fn ensure_topic_is_idempotent(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, _| {
        Box::pin(async move {
            ensure!(
                fx.admin().ensure_topic("pedidos.eventos", 3).await? == 3,
                "created with 3"
            );
            ensure!(
                fx.admin().ensure_topic("pedidos.eventos", 3).await? == 3,
                "second call"
            );
            ensure!(
                fx.admin().ensure_topic("pedidos.eventos", 5).await? == 3,
                "kept 3 partitions"
            );
            let ends = fx.end_offsets("pedidos.eventos").await?;
            ensure!(
                ends == vec![(0, 0), (1, 0), (2, 0)],
                "end offsets of a new topic: {ends:?}"
            );
            Ok(())
        })
    })
    .await
}

/// Publishing to a missing topic fails with `UnknownTopic` and appends nothing, even for the
/// known topics of the same batch.
pub async fn unknown_topic_is_rejected(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, _| {
        Box::pin(async move {
            fx.admin().ensure_topic("conocido", 1).await?;
            let res = fx
                .publisher()
                .publish(&[message("no.existe", Some("k"), "x")])
                .await;
            ensure!(
                matches!(&res, Err(TransportError::UnknownTopic { topic }) if topic == "no.existe"),
                "publish to a missing topic gave {res:?}"
            );
            let batch = [
                message("conocido", Some("k"), "a"),
                message("no.existe", Some("k"), "b"),
            ];
            let res = fx.publisher().publish(&batch).await;
            ensure!(res.is_err(), "a batch with a missing topic was accepted");
            ensure!(
                fx.end_offsets("conocido").await? == vec![(0, 0)],
                "a rejected batch appended records"
            );
            Ok(())
        })
    })
    .await
}

/// Messages sharing a key keep their order and land on `partition_for(key)`.
pub async fn key_order_and_placement(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, _| {
        Box::pin(async move {
            let (topic, partitions) = ("orden", 4);
            fx.admin().ensure_topic(topic, partitions).await?;
            let keys: Vec<String> = (0..8).map(|k| format!("P-{k}")).collect();
            for round in 0..3 {
                let mut batch = Vec::new();
                for i in 0..5 {
                    for key in &keys {
                        batch.push(message(
                            topic,
                            Some(key),
                            &format!("{key}:{}", round * 5 + i),
                        ));
                    }
                }
                batch.push(message(topic, None, "sin-clave"));
                fx.publisher().publish(&batch).await?;
            }
            let mut seqs: BTreeMap<String, Vec<u32>> = BTreeMap::new();
            let mut keyless = 0;
            for p in 0..partitions {
                for r in read_all(fx, topic, p).await? {
                    let Some(key) = r.key.clone() else {
                        keyless += 1;
                        continue;
                    };
                    ensure!(
                        r.partition == p && p == partition_for(&key, partitions),
                        "{key} on partition {p}"
                    );
                    let payload = text(&r);
                    let n = payload
                        .rsplit(':')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .ok_or("bad payload")?;
                    seqs.entry(key).or_default().push(n);
                }
            }
            ensure!(keyless == 3, "{keyless} keyless records, expected 3");
            for key in &keys {
                let got = seqs.get(key).cloned().unwrap_or_default();
                ensure!(
                    got == (0..15).collect::<Vec<u32>>(),
                    "order of {key}: {got:?}"
                );
            }
            Ok(())
        })
    })
    .await
}

/// Headers (repeated names, empty and non-ASCII values), key and binary payload round-trip.
pub async fn headers_round_trip(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, _| {
        Box::pin(async move {
            fx.admin().ensure_topic("cabeceras", 1).await?;
            let mut headers = Headers::new();
            headers.push("tipo", "pedido.creado");
            headers.push("id_evento", "0b6a5c1e-4f43-4c39-9d0e-1f2a3b4c5d6e");
            headers.push("motivo", "stock insuficiente: añadir € y 日本");
            headers.push("x", "1");
            headers.push("x", "2");
            headers.push("vacia", "");
            let sent = OutgoingMessage {
                topic: "cabeceras".into(),
                key: Some("clave ñ".into()),
                headers: headers.clone(),
                payload: vec![0, 159, 146, 150, 255, b'{', 0],
            };
            fx.publisher().publish(std::slice::from_ref(&sent)).await?;
            let got = fx.read("cabeceras", 0, 0, 10).await?;
            ensure!(got.len() == 1, "{} records read", got.len());
            let r = &got[0];
            ensure!(r.headers == headers, "headers changed: {:?}", r.headers);
            ensure!(
                r.headers.get("x") == Some("2"),
                "last value of a repeated header"
            );
            ensure!(
                r.key == sent.key && r.payload == sent.payload,
                "key or payload changed"
            );
            ensure!(
                r.topic == "cabeceras" && r.offset == 0,
                "topic/offset {}/{}",
                r.topic,
                r.offset
            );
            Ok(())
        })
    })
    .await
}

/// Concurrent publishers produce offsets without gaps or duplicates in every partition.
pub async fn concurrent_publishers_gap_free(h: &dyn LogHarness) -> Scenario {
    run(h, |fx, _| {
        Box::pin(async move {
            let (topic, partitions, tasks, batches) = ("concurrente", 3u32, 4, 25);
            fx.admin().ensure_topic(topic, partitions).await?;
            let mut handles = Vec::new();
            for t in 0..tasks {
                let publisher = Arc::clone(&fx.publisher());
                handles.push(tokio::spawn(async move {
                    for b in 0..batches {
                        let batch: Vec<_> = (0..2)
                            .map(|i| {
                                message(
                                    topic,
                                    Some(&format!("k{}", (t + b + i) % 10)),
                                    &format!("{t}-{b}-{i}"),
                                )
                            })
                            .collect();
                        publisher.publish(&batch).await?;
                    }
                    Ok::<(), TransportError>(())
                }));
            }
            for handle in handles {
                handle.await??;
            }
            let mut payloads = HashSet::new();
            for p in 0..partitions {
                let records = read_all(fx, topic, p).await?;
                for (i, r) in records.iter().enumerate() {
                    ensure!(
                        r.offset == i as i64,
                        "partition {p}: offset {} at position {i}",
                        r.offset
                    );
                    ensure!(payloads.insert(text(r)), "duplicate record {}", text(r));
                }
                let end = fx.end_offsets(topic).await?;
                ensure!(
                    end.contains(&(p, records.len() as i64)),
                    "end offsets {end:?} vs {} records",
                    records.len()
                );
            }
            let want = (tasks * batches * 2) as usize;
            if payloads.len() != want {
                // Say which are missing, and whether a later read finds them: a record the
                // transport confirmed but never stored, or one stored but not yet readable.
                let mut missing: Vec<String> = (0..tasks)
                    .flat_map(|t| (0..batches).flat_map(move |b| (0..2).map(move |i| (t, b, i))))
                    .map(|(t, b, i)| format!("{t}-{b}-{i}"))
                    .filter(|p| !payloads.contains(p))
                    .collect();
                missing.sort();
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                let mut later = 0;
                for p in 0..partitions {
                    later += read_all(fx, topic, p).await?.len();
                }
                let end = fx.end_offsets(topic).await?;
                return Err(crate::BoxError::from(crate::CheckFailed(format!(
                    "{} records, expected {want}; missing {missing:?}; 2 s later {later} records, \
                     end offsets {end:?}",
                    payloads.len()
                ))));
            }
            Ok(())
        })
    })
    .await
}
