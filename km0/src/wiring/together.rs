//! Parts of one component that run together as one task: one part stopping (done or failed)
//! stops the others, so none runs on alone unnoticed, and the task ends with the first error.

use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use entrega::CancellationToken;
use futures::future::BoxFuture;
use futures::FutureExt as _;

use super::Task;

/// One part: what it is called in errors, and the future that runs it until `child` is
/// cancelled.
pub type Part = (&'static str, BoxFuture<'static, anyhow::Result<()>>);

/// Spawns `parts` as one task; each part's end cancels `child`, which the parts watch. The
/// task ends with the first error in time (the others often fail because of it, or while
/// stopping), and each part that fails says so as it does.
pub fn run_together(parts: Vec<Part>, child: CancellationToken) -> Task {
    let first: Arc<Mutex<Option<anyhow::Error>>> = Arc::default();
    let watched: Vec<_> = parts
        .into_iter()
        .map(|(name, part)| {
            let (child, first) = (child.clone(), Arc::clone(&first));
            async move {
                if let Err(e) = part.await.context(name) {
                    tracing::error!(part = name, error = format!("{e:#}"), "stopped");
                    let mut first = first.lock().unwrap_or_else(|p| p.into_inner());
                    if first.is_none() {
                        *first = Some(e);
                    }
                }
                child.cancel();
            }
            .boxed()
        })
        .collect();
    tokio::spawn(async move {
        futures::future::join_all(watched).await;
        let first = first.lock().unwrap_or_else(|p| p.into_inner()).take();
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}
