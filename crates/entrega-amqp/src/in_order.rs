//! A batch's publishes handed to the connection at once, in order: each message's frames are
//! queued (and its confirm's delivery tag taken) while the caller holds the channel, and the
//! wait for them to be written happens after, so the connection writes the batch in one go
//! and other callers queue theirs meanwhile.

use std::future::Future;
use std::pin::Pin;

use entrega_core::TransportError;
use futures::future::{maybe_done, MaybeDone};
use lapin::options::BasicPublishOptions;
use lapin::Channel;

use crate::error::{classify_for, short};
use crate::publisher::Outgoing;

/// A published message waiting for its confirm: where it went, and the confirm.
pub(crate) type Pending = (String, String, lapin::PublisherConfirm);

type Publishing<'a> = Pin<Box<dyn Future<Output = Result<Pending, TransportError>> + Send + 'a>>;

/// Publishes queued on a channel, not yet known to be written.
pub(crate) struct Started<'a> {
    publishing: Vec<Pin<Box<MaybeDone<Publishing<'a>>>>>,
}

/// Queues every message of `batch` on `channel`, in order, `mandatory`.
pub(crate) async fn start_all<'a>(channel: &Channel, batch: &'a [Outgoing<'_>]) -> Started<'a> {
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let mut publishing = Vec::with_capacity(batch.len());
    for out in batch {
        let channel = channel.clone();
        let publish: Publishing<'a> = Box::pin(async move {
            let confirm = channel
                .basic_publish(
                    short("exchange", &out.exchange)?,
                    short("routing key", &out.routing_key)?,
                    options,
                    out.payload,
                    out.properties.clone(),
                )
                .await
                .map_err(|e| classify_for(&out.exchange, e))?;
            Ok((out.exchange.clone(), out.routing_key.clone(), confirm))
        });
        let mut publish = Box::pin(maybe_done(publish));
        // The first poll queues the frames; what is left is the wait for the write.
        let _ = futures::poll!(publish.as_mut());
        publishing.push(publish);
    }
    Started { publishing }
}

impl Started<'_> {
    /// Messages in the batch.
    pub(crate) fn len(&self) -> usize {
        self.publishing.len()
    }

    /// Waits until every message was written: one outcome per message, in order.
    pub(crate) async fn written(self) -> Vec<Result<Pending, TransportError>> {
        let mut outcomes = Vec::with_capacity(self.publishing.len());
        for mut publish in self.publishing {
            publish.as_mut().await;
            outcomes.push(publish.as_mut().take_output().unwrap_or_else(|| {
                Err(TransportError::unavailable(
                    "a publish ended without an outcome",
                ))
            }));
        }
        outcomes
    }
}
