//! Parts of one component that run together as one task: one part stopping (done or failed)
//! stops the others, so none runs on alone unnoticed, and the task ends with the first error.

use anyhow::Context as _;
use entrega::CancellationToken;
use futures::future::BoxFuture;
use futures::FutureExt as _;

use super::Task;

/// One part: what it is called in errors, and the future that runs it until `child` is
/// cancelled.
pub(super) type Part = (&'static str, BoxFuture<'static, anyhow::Result<()>>);

/// Spawns `parts` as one task; each part's end cancels `child`, which the parts watch.
pub(super) fn run_together(parts: Vec<Part>, child: CancellationToken) -> Task {
    let watched: Vec<_> = parts
        .into_iter()
        .map(|(name, part)| {
            let child = child.clone();
            async move {
                let r = part.await.context(name);
                child.cancel();
                r
            }
            .boxed()
        })
        .collect();
    tokio::spawn(async move {
        futures::future::join_all(watched)
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<()>>>()
            .map(drop)
    })
}
