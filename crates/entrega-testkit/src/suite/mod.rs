//! The conformance scenarios, one public async function each, grouped by seam.
//!
//! A backend runs them through [`crate::outbox_conformance!`], [`crate::inbox_conformance!`]
//! and [`crate::log_conformance!`] (one `#[tokio::test]` per scenario), or all at once through
//! the `run_all` function of each module.

pub mod delivery;
pub mod dlq;
pub mod inbox;
mod log_groups;
mod log_support;
mod log_topics;
mod outbox_lanes;
mod outbox_leases;
mod outbox_refused;
mod outbox_rows;
mod outbox_support;
pub mod parking;

/// Outbox scenarios: [`LaneLeases`](entrega_core::LaneLeases),
/// [`OutboxReader`](entrega_core::OutboxReader), [`OutboxMaintenance`](entrega_core::OutboxMaintenance)
/// and [`OutboxWakeup`](entrega_core::OutboxWakeup), plus the backend's `enqueue`.
pub mod outbox {
    pub use super::outbox_lanes::{
        mark_lanes_fences_each_lane, pending_lanes_after_reads_past_the_cursor,
        pending_lanes_matches_each_lane,
    };
    pub use super::outbox_leases::{
        expired_owner_is_taken_over_and_fenced, mark_requires_valid_lease,
        owners_converge_to_disjoint_lanes, restarted_owner_takes_its_lanes_back_at_once,
    };
    pub use super::outbox_refused::{
        held_row_waits_for_release, refusal_requires_valid_lease,
        refused_row_holds_back_only_its_aggregate, refused_row_keeps_its_aggregate_in_order,
    };
    pub use super::outbox_rows::{
        late_commit_is_still_pending, pending_follows_insertion_order,
        purge_removes_published_by_age, rolled_back_enqueue_leaves_nothing, status_reports_backlog,
        wakeup_returns_after_commit,
    };
    pub use super::outbox_support::event;
}

/// Log transport scenarios: [`crate::Publisher`](entrega_core::Publisher),
/// [`TopicAdmin`](entrega_core::TopicAdmin) and [`Subscriber`](entrega_core::Subscriber).
pub mod log {
    pub use super::log_groups::{
        pause_holds_one_partition, restarted_member_takes_its_partitions_back_at_once,
        resume_from_committed_offset, seek_redelivers, silent_member_loses_partitions,
        stale_commit_is_refused, two_members_split_partitions, uncommitted_records_are_redelivered,
    };
    pub use super::log_topics::{
        concurrent_publishers_gap_free, ensure_topic_is_idempotent, headers_round_trip,
        key_order_and_placement, unknown_topic_is_rejected,
    };
}
