//! The conformance scenarios, one public async function each, grouped by seam.
//!
//! A backend runs them through [`crate::outbox_conformance!`], [`crate::inbox_conformance!`]
//! and [`crate::log_conformance!`] (one `#[tokio::test]` per scenario), or all at once through
//! the `run_all` function of each module.

pub mod inbox;
mod log_groups;
mod log_support;
mod log_topics;
pub mod outbox;

/// Log transport scenarios: [`crate::Publisher`](entrega_core::Publisher),
/// [`TopicAdmin`](entrega_core::TopicAdmin) and [`Subscriber`](entrega_core::Subscriber).
pub mod log {
    pub use super::log_groups::{
        pause_holds_one_partition, resume_from_committed_offset, seek_redelivers,
        silent_member_loses_partitions, stale_commit_is_refused, two_members_split_partitions,
        uncommitted_records_are_redelivered,
    };
    pub use super::log_topics::{
        concurrent_publishers_gap_free, ensure_topic_is_idempotent, headers_round_trip,
        key_order_and_placement, unknown_topic_is_rejected,
    };
}
